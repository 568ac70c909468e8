"""Keras models that nest layers (a ``Sequential``, a functional sub-model, a custom layer holding layers), for the
float64 rebuild's tests: factories that ``parity init --keras FILE:FUNCTION`` names."""

from __future__ import annotations

import keras
from keras import layers


@keras.saving.register_keras_serializable(package="parity_tests")
class GatedBlock(layers.Layer):
    """A custom layer holding two Dense layers it makes without a dtype."""

    def __init__(self, units: int = 6, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.inner = layers.Dense(units, name="inner")
        self.gate = layers.Dense(units, name="gate")

    def build(self, input_shape):
        self.inner.build(input_shape)
        self.gate.build(input_shape)

    def call(self, x):
        return self.inner(x) * keras.ops.sigmoid(self.gate(x))

    def get_config(self):
        return {**super().get_config(), "units": self.units}


@keras.saving.register_keras_serializable(package="parity_tests")
class Float32Scale(layers.Layer):
    """A custom layer that keeps its weight in float32 and computes in the model's dtype."""

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(input_shape[-1],), initializer="ones", dtype="float32", name="scale")

    def call(self, x):
        return x * keras.ops.cast(self.scale, x.dtype)


def make_nested():
    """Input -> Conv -> Sequential ``bottleneck`` [conv_a, conv_b] -> a functional sub-model -> a custom layer
    holding layers -> Dense."""
    keras.utils.set_random_seed(0)
    x = keras.Input((8, 8, 3), name="x")
    h = layers.Conv2D(4, 3, padding="same", name="stem")(x)
    bottleneck = keras.Sequential(
        [layers.Conv2D(4, 3, padding="same", activation="relu", name="conv_a"), layers.Conv2D(4, 1, name="conv_b")],
        name="bottleneck",
    )
    h = bottleneck(h)
    inner = keras.Input((8, 8, 4))
    h = keras.Model(inner, layers.Conv2D(4, 1, name="proj")(inner), name="sub")(h)
    h = layers.GlobalAveragePooling2D(name="pool")(h)
    h = Float32Scale(name="scale")(GatedBlock(6, name="block")(h))
    return keras.Model(x, layers.Dense(3, name="head")(h), name="nested")


@keras.saving.register_keras_serializable(package="parity_tests")
class Float32Block(layers.Layer):
    """A custom layer whose sublayer computes in float32 whatever the model's dtype: no float64 rebuild."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.inner = layers.Dense(5, dtype="float32", name="inner")

    def build(self, input_shape):
        self.inner.build(input_shape)

    def call(self, x):
        return keras.ops.cast(self.inner(x), x.dtype)


def make_float32_block():
    """A model that cannot run in float64 (a sublayer fixed in float32): its golden reference falls back to
    float32, with widened tolerances."""
    keras.utils.set_random_seed(0)
    x = keras.Input((6,), name="x")
    h = Float32Block(name="block")(layers.Dense(5, name="dense")(x))
    return keras.Model(x, layers.Dense(3, name="head")(h), name="f32block")
