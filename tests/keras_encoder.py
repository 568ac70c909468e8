"""Keras models for the tree's tests on ``tf/xla`` and tf2onnx: a hand-written encoder (custom ``EncoderBlock`` layers
holding attention, norms and a feed-forward of Dense layers held in a dict; the blocks in a list attribute) and a
model calling one layer twice. Factories that ``parity init --keras FILE:FUNCTION`` names."""

from __future__ import annotations

import keras
from keras import layers

WIDTH, HEADS = 16, 2


def _norm(name: str, dtype) -> layers.LayerNormalization:
    """Random gamma and beta, so that a norm's weights matter."""
    return layers.LayerNormalization(
        epsilon=1e-5,
        gamma_initializer=keras.initializers.RandomUniform(0.5, 1.5),
        beta_initializer=keras.initializers.RandomNormal(stddev=0.2),
        dtype=dtype,
        name=name,
    )


@keras.saving.register_keras_serializable(package="keras_encoder")
class FeedForward(layers.Layer):
    """``down(up(x))``, its Dense layers held in a dict attribute."""

    def __init__(self, hidden: int = 32, **kwargs):
        super().__init__(**kwargs)
        self.hidden = hidden
        # in the layer's own dtype: parity rebuilds the model in float64 for its reference
        self.parts = {
            "up": layers.Dense(hidden, activation="silu", dtype=self.dtype_policy, name="up"),
            "down": layers.Dense(WIDTH, dtype=self.dtype_policy, name="down"),
        }

    def build(self, shape):
        self.parts["up"].build(shape)
        self.parts["down"].build(tuple(shape[:-1]) + (self.hidden,))

    def call(self, x):
        return self.parts["down"](self.parts["up"](x))

    def get_config(self):
        return {**super().get_config(), "hidden": self.hidden}


@keras.saving.register_keras_serializable(package="keras_encoder")
class EncoderBlock(layers.Layer):
    """Post-norm transformer block: ``n1 = norm1(x + attn(x, x))``, ``norm2(n1 + ffn(n1))``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        dtype = self.dtype_policy
        self.attn = layers.MultiHeadAttention(HEADS, WIDTH // HEADS, dtype=dtype, name="attn")
        self.norm1 = _norm("norm1", dtype)
        self.ffn = FeedForward(name="ffn", dtype=dtype)
        self.norm2 = _norm("norm2", dtype)

    def build(self, shape):
        self.attn.build(shape, shape)
        self.norm1.build(shape)
        self.ffn.build(shape)
        self.norm2.build(shape)

    def call(self, x):
        h = self.norm1(x + self.attn(x, x))
        return self.norm2(h + self.ffn(h))

    def get_config(self):
        return super().get_config()


@keras.saving.register_keras_serializable(package="keras_encoder")
class Encoder(layers.Layer):
    """``depth`` blocks held in a list attribute."""

    def __init__(self, depth: int = 2, **kwargs):
        super().__init__(**kwargs)
        self.depth = depth
        self.blocks = [EncoderBlock(name=f"block_{i}", dtype=self.dtype_policy) for i in range(depth)]

    def build(self, shape):
        for block in self.blocks:
            block.build(shape)

    def call(self, x):
        for block in self.blocks:
            x = block(x)
        return x

    def get_config(self):
        return {**super().get_config(), "depth": self.depth}


def make_encoder():
    """x (2x6x8) -> proj -> encoder (block_0, block_1: attn, norm1, ffn {up, down}, norm2) -> head -> (2x6x4)."""
    keras.utils.set_random_seed(0)
    x = keras.Input((6, 8), name="x")
    h = Encoder(2, name="encoder")(layers.Dense(WIDTH, name="proj")(x))
    return keras.Model(x, layers.Dense(4, name="head")(h), name="encoder_model")


def make_shared():
    """x (2x8) -> proj -> shared -> tanh -> shared (the same Dense again) -> head -> (2x3)."""
    keras.utils.set_random_seed(0)
    x = keras.Input((8,), name="x")
    shared = layers.Dense(8, name="shared")
    h = shared(layers.Activation("tanh", name="act")(shared(layers.Dense(8, name="proj")(x))))
    return keras.Model(x, layers.Dense(3, name="head")(h), name="shared_model")
