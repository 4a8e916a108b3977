"""keras.io's GAN (tests/recipes/fit_gan.py) as a recipe: build_model() returns the compiled GAN,
whose compile() takes two optimizers of its own; dataset() gives each replica its images.

The runner builds those optimizers before a restore by tracing ``train_step`` once with the
recipe's batch spec (runner/keras_recipes/own_step.py), so a resumed run fills their state from
the checkpoint (tests/integration/test_own_train_step.py kills the chief mid-epoch).
"""

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

from keras import ops

latent_dim = 8


class GAN(keras.Model):
    def __init__(self, discriminator, generator, latent_dim):
        super().__init__()
        self.discriminator = discriminator
        self.generator = generator
        self.latent_dim = latent_dim
        self.seed_generator = keras.random.SeedGenerator(1337)

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = loss_fn
        self.d_loss_metric = keras.metrics.Mean(name="d_loss")
        self.g_loss_metric = keras.metrics.Mean(name="g_loss")

    @property
    def metrics(self):
        return [self.d_loss_metric, self.g_loss_metric]

    def train_step(self, real_images):
        batch_size = ops.shape(real_images)[0]
        random_latent_vectors = keras.random.normal(shape=(batch_size, self.latent_dim), seed=self.seed_generator)
        generated_images = self.generator(random_latent_vectors)
        combined_images = ops.concatenate([generated_images, real_images], axis=0)
        labels = ops.concatenate([ops.ones((batch_size, 1)), ops.zeros((batch_size, 1))], axis=0)
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, self.discriminator(combined_images))
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
        random_latent_vectors = keras.random.normal(shape=(batch_size, self.latent_dim), seed=self.seed_generator)
        misleading_labels = ops.zeros((batch_size, 1))
        with tf.GradientTape() as tape:
            g_loss = self.loss_fn(misleading_labels, self.discriminator(self.generator(random_latent_vectors)))
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
        self.d_loss_metric.update_state(d_loss)
        self.g_loss_metric.update_state(g_loss)
        return {"d_loss": self.d_loss_metric.result(), "g_loss": self.g_loss_metric.result()}


DEFAULTS = {"epochs": 2, "steps_per_epoch": 10, "global_batch_size": 32, "save_every_steps": 5}


def build_model(params):
    layers = keras.layers
    discriminator = keras.Sequential([keras.Input(shape=(64,)), layers.Dense(32), layers.LeakyReLU(0.2),
                                      layers.Dense(1)], name="discriminator")
    generator = keras.Sequential([keras.Input(shape=(latent_dim,)), layers.Dense(32), layers.LeakyReLU(0.2),
                                  layers.Dense(64, activation="sigmoid")], name="generator")
    gan = GAN(discriminator=discriminator, generator=generator, latent_dim=latent_dim)
    gan.compile(d_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
                g_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
                loss_fn=keras.losses.BinaryCrossentropy(from_logits=True))
    return gan


def dataset(input_context, epoch, seed):
    digits = (load_digits().images / 16.0).astype(np.float32).reshape(-1, 64)
    ds = tf.data.Dataset.from_tensor_slices(digits)
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    ds = ds.shuffle(2048, seed=seed * 1000 + epoch).repeat()
    return ds.batch(input_context.per_replica_batch_size, drop_remainder=True)
