DIGITS = "recipes/digits_cnn.py"
# Small enough for CI (2 epochs x 10 steps, a seeded Dropout in the model), big enough
# to kill mid-epoch after a committed checkpoint.
DIGITS_FLAGS = ("--epochs", "2", "--steps-per-epoch", "10", "--global-batch-size", "32", "--save-every-steps", "4")
