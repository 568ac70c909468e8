"""The model of tests/diagnose/tree/test_tree_keras_resize.py: a functional Keras model with a sub-model ``encoder`` of custom
Conv-BatchNormalization-ReLU layers (``stage_0``, ``stage_1``), a ``Sequential`` bottleneck and a bicubic ``Resizing``
from 8x8 (to 15x15: tf2onnx computes the cubic weights exactly where TensorFlow reads a table; to 16x16: they agree).
Every activation is 2x8x8x8, so shapes cannot tell NHWC from the NCHW tf2onnx computes in."""

import keras
from keras import layers


@keras.saving.register_keras_serializable(package="test_tree_keras_resize")
class ConvBNAct(keras.layers.Layer):
    def __init__(self, filters=8, **kwargs):
        super().__init__(**kwargs)
        self.filters = filters
        self.conv = layers.Conv2D(filters, 3, padding="same", dtype=self.dtype_policy, name="conv")
        self.bn = layers.BatchNormalization(dtype=self.dtype_policy, name="bn")
        self.act = layers.Activation("relu", dtype=self.dtype_policy, name="act")

    def build(self, shape):
        self.conv.build(shape)
        self.bn.build(tuple(shape[:-1]) + (self.filters,))
        self.act.build(tuple(shape[:-1]) + (self.filters,))

    def call(self, x):
        return self.act(self.bn(self.conv(x)))

    def get_config(self):
        return {**super().get_config(), "filters": self.filters}


def _make(size):
    keras.utils.set_random_seed(0)
    inner = keras.Input((8, 8, 3), name="encoder_in")
    h = ConvBNAct(8, name="stage_0")(inner)
    h = ConvBNAct(8, name="stage_1")(h)
    encoder = keras.Model(inner, h, name="encoder")
    bottleneck = keras.Sequential(
        [layers.Conv2D(8, 1, activation="relu", name="squeeze"), layers.Conv2D(8, 1, name="expand")],
        name="bottleneck",
    )
    x = keras.Input((8, 8, 3), name="x")
    h = bottleneck(encoder(x))
    h = layers.Resizing(size, size, interpolation="bicubic", name="resize")(h)
    out = layers.Conv2D(3, 1, name="head")(h)
    model = keras.Model(x, out, name="upnet")
    # non-trivial BN statistics
    import numpy as np

    rng = np.random.default_rng(1)
    for layer in model.get_layer("encoder").layers:
        if isinstance(layer, ConvBNAct):
            bn = layer.bn
            bn.moving_mean.assign(rng.normal(0, 0.2, bn.moving_mean.shape).astype("float32"))
            bn.moving_variance.assign(rng.uniform(0.5, 1.5, bn.moving_variance.shape).astype("float32"))
            bn.gamma.assign(rng.uniform(0.5, 1.5, bn.gamma.shape).astype("float32"))
            bn.beta.assign(rng.normal(0, 0.2, bn.beta.shape).astype("float32"))
    return model


def make_15():
    return _make(15)


def make_16():
    return _make(16)
