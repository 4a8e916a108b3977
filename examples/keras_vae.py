# The keras.io "Variational AutoEncoder" example (fchollet), with its own train_step, metric
# trackers and a seeded sampling layer, on scikit-learn's digits (8x8, shipped offline) in
# place of the MNIST download: so the encoder and decoder are Dense instead of Conv2D, and
# the dataset is repeated with steps_per_epoch (docs/keras.md, "Input"). The rest is the
# example's: VAE(keras.Model) overrides train_step, computes its own loss, applies its
# gradients with self.optimizer.apply_gradients and reports keras.metrics.Mean trackers
# listed by its `metrics` property. Plus the multi-worker tutorial's strategy lines.
#
#   resilient-train run examples/keras_vae.py --workers 2 --run-dir runs/vae
import keras
import numpy as np
import tensorflow as tf
from keras import layers, ops
from sklearn.datasets import load_digits

keras.utils.set_random_seed(1337)


class Sampling(layers.Layer):
    """Uses (z_mean, z_log_var) to sample z, the vector encoding a digit."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seed_generator = keras.random.SeedGenerator(1337)

    def call(self, inputs):
        z_mean, z_log_var = inputs
        batch = ops.shape(z_mean)[0]
        dim = ops.shape(z_mean)[1]
        epsilon = keras.random.normal(shape=(batch, dim), seed=self.seed_generator)
        return z_mean + ops.exp(0.5 * z_log_var) * epsilon


latent_dim = 2


def build_encoder():
    encoder_inputs = keras.Input(shape=(8, 8))
    x = layers.Flatten()(encoder_inputs)
    x = layers.Dense(32, activation="relu")(x)
    x = layers.Dense(16, activation="relu")(x)
    z_mean = layers.Dense(latent_dim, name="z_mean")(x)
    z_log_var = layers.Dense(latent_dim, name="z_log_var")(x)
    z = Sampling()([z_mean, z_log_var])
    return keras.Model(encoder_inputs, [z_mean, z_log_var, z], name="encoder")


def build_decoder():
    latent_inputs = keras.Input(shape=(latent_dim,))
    x = layers.Dense(16, activation="relu")(latent_inputs)
    x = layers.Dense(32, activation="relu")(x)
    x = layers.Dense(64, activation="sigmoid")(x)
    decoder_outputs = layers.Reshape((8, 8))(x)
    return keras.Model(latent_inputs, decoder_outputs, name="decoder")


class VAE(keras.Model):
    def __init__(self, encoder, decoder, **kwargs):
        super().__init__(**kwargs)
        self.encoder = encoder
        self.decoder = decoder
        self.total_loss_tracker = keras.metrics.Mean(name="total_loss")
        self.reconstruction_loss_tracker = keras.metrics.Mean(name="reconstruction_loss")
        self.kl_loss_tracker = keras.metrics.Mean(name="kl_loss")

    @property
    def metrics(self):
        return [
            self.total_loss_tracker,
            self.reconstruction_loss_tracker,
            self.kl_loss_tracker,
        ]

    def train_step(self, data):
        with tf.GradientTape() as tape:
            z_mean, z_log_var, z = self.encoder(data)
            reconstruction = self.decoder(z)
            reconstruction_loss = ops.mean(
                ops.sum(
                    keras.losses.binary_crossentropy(data, reconstruction),
                    axis=1,
                )
            )
            kl_loss = -0.5 * (1 + z_log_var - ops.square(z_mean) - ops.exp(z_log_var))
            kl_loss = ops.mean(ops.sum(kl_loss, axis=1))
            total_loss = reconstruction_loss + kl_loss
        grads = tape.gradient(total_loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        self.total_loss_tracker.update_state(total_loss)
        self.reconstruction_loss_tracker.update_state(reconstruction_loss)
        self.kl_loss_tracker.update_state(kl_loss)
        return {
            "loss": self.total_loss_tracker.result(),
            "reconstruction_loss": self.reconstruction_loss_tracker.result(),
            "kl_loss": self.kl_loss_tracker.result(),
        }


strategy = tf.distribute.MultiWorkerMirroredStrategy()  # first: before any TensorFlow op

digits = (load_digits().images / 16.0).astype("float32")  # was: keras.datasets.mnist.load_data(), / 255
digits = np.random.default_rng(7).permutation(digits)  # shuffled once, the same on every worker and attempt
dataset = tf.data.Dataset.from_tensor_slices(digits).repeat().batch(64)
with strategy.scope():
    vae = VAE(build_encoder(), build_decoder())
    vae.compile(optimizer=keras.optimizers.Adam())
vae.fit(dataset, epochs=4, steps_per_epoch=14)
