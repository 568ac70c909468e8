"""A Keras model as users write them, for the descent into a ``.tflite`` file: a functional model whose ``blocks`` is
a ``keras.Sequential`` of custom residual layers, each holding Dense / LayerNormalization / Activation layers as
tracked attributes; factories ``parity init --keras FILE:FUNCTION`` names.

None of the activations, special functions and normalizations tried (exact and tanh GELU, softplus, log_softmax,
hard_sigmoid, hard_silu, ELU, SELU, SiLU, Mish, LayerNorm at epsilon 1e-6) departs on today's LiteRT by more than
the float32 tolerance (at most 0.8 of it against float64; ``erf`` is not converted at all), so the departure is
injected: one leaf computes another function while, and only while, parity's TFLite exporter converts the model
(a frame of ``parity.exporters.tf_litert`` is on the Python stack as the converter traces the model); the native
``tf`` path, the ``tf/onnx`` paths and the golden build compute it as declared. Frameworks are imported inside:
worker processes import this file by path.

``make_gelu`` and ``make_shift`` (for ``parity repro``): three residual layers ``x + act(dense(x))``, the activation
of ``block_1`` a custom layer: the erf GELU computed as the tanh GELU while the converter traces it (departs on
tf/litert only), or ``Shift``, which loses float32 digits to cancellation (departs at float32 on every path).
"""

from __future__ import annotations

import math
import sys

WIDTH = 16
REPRO_WIDTH = 8  # make_gelu's and make_shift's
FAULTY = "blocks/res_block_1/act"  # the leaf that departs on tf/litert in make_faulty_blocks


def _converted_to_tflite() -> bool:
    """True while parity's TFLite exporter is on the Python stack (it traces the model for the converter)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") == "parity.exporters.tf_litert":
            return True
        frame = frame.f_back
    return False


def _residual_block():
    import keras
    from keras import layers

    @keras.saving.register_keras_serializable(package="keras_litert")
    class ResBlock(layers.Layer):
        """``x + out(act(norm(fc(x))))``; its layers are tracked attributes."""

        def __init__(self, width: int = WIDTH, activation: str = "gelu", **kwargs):
            super().__init__(**kwargs)
            self.width, self.activation = width, activation
            gamma, beta = keras.initializers.RandomUniform(0.5, 1.5), keras.initializers.RandomNormal(stddev=0.2)
            # in the layer's own dtype: parity rebuilds the model in float64 for its reference
            self.fc = layers.Dense(width, dtype=self.dtype_policy, name="fc")
            self.norm = layers.LayerNormalization(
                gamma_initializer=gamma, beta_initializer=beta, dtype=self.dtype_policy, name="norm"
            )
            self.act = layers.Activation(activation, dtype=self.dtype_policy, name="act")
            self.out = layers.Dense(width, dtype=self.dtype_policy, name="out")

        def build(self, shape):
            inner = tuple(shape[:-1]) + (self.width,)
            self.fc.build(shape)
            self.norm.build(inner)
            self.out.build(inner)

        def call(self, x):
            return x + self.out(self.act(self.norm(self.fc(x))))

        def get_config(self):
            return {**super().get_config(), "width": self.width, "activation": self.activation}

    return ResBlock


def gelu(x):
    """Keras's ``gelu`` (exact, erf); under the TFLite converter the tanh approximation, as a converter that
    rewrites GELU into its tanh form computes it. Named ``gelu``: the layer's config is still ``"gelu"``."""
    import keras

    if not _converted_to_tflite():
        return keras.activations.gelu(x, approximate=False)
    ops = keras.ops
    return 0.5 * x * (1.0 + ops.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def _model(faulty: bool):
    import keras
    from keras import layers

    ResBlock = _residual_block()
    keras.utils.set_random_seed(0)
    blocks = keras.Sequential([ResBlock(name=f"res_block_{i}") for i in range(3)], name="blocks")
    x = keras.Input((12,), name="x")
    mix = layers.Dense(WIDTH, activation="tanh", name="mix")  # called twice: shared weights
    h = blocks(mix(mix(layers.Dense(WIDTH, name="proj")(x))))
    h = layers.Activation("relu", name="relu")(layers.Dense(WIDTH, name="pre")(h))  # the converter fuses the two
    model = keras.Model(x, layers.Dense(3, name="head")(h), name="resnet")
    if faulty:  # the float32 model only: parity's float64 reference is rebuilt from the config ("gelu")
        model.get_layer("blocks").get_layer("res_block_1").act.activation = gelu
    return model


def make_blocks():
    """x (2x12) -> proj -> mix (a tanh Dense called twice) -> blocks (Sequential of 3 ``ResBlock``: fc, norm, act
    (exact GELU), out) -> pre (Dense) -> relu (Activation; TFLite fuses it into pre's FULLY_CONNECTED) -> head
    (2x3)."""
    return _model(faulty=False)


def make_default_names():
    """The names Keras gives layers by default, spelled out (its counters run on across the models of one process):
    x (2x12) -> ``dense`` -> ``dense_1`` (tanh) -> ``sequential`` (``res_block``, ``res_block_1``, tanh) -> ``dense_2``
    (softmax, the model's output). Under ``tf.function`` each scope gets one more ``_<n>``: layer ``dense``'s ops are
    scoped ``dense_1``, layer ``dense_1``'s ``dense_1_2``."""
    import keras
    from keras import layers

    ResBlock = _residual_block()
    keras.utils.set_random_seed(0)
    x = keras.Input((12,), name="x")
    h = layers.Dense(WIDTH, activation="tanh", name="dense_1")(layers.Dense(WIDTH, name="dense")(x))
    blocks = [ResBlock(activation="tanh", name=name) for name in ("res_block", "res_block_1")]  # tf2onnx has no erf
    h = keras.Sequential(blocks, name="sequential")(h)
    return keras.Model(x, layers.Dense(3, activation="softmax", name="dense_2")(h), name="functional")


def make_faulty_blocks():
    """``make_blocks`` with ``blocks/res_block_1/act`` computing the tanh GELU on ``tf/litert`` only."""
    return _model(faulty=True)


def _repro_model(activation: str):
    """Input (6) -> Dense ``proj`` -> Sequential ``blocks`` of three residual layers (``x + act(dense(x))``, the
    faulty activation in ``block_1``) -> Dense ``head`` (3)."""
    import keras
    from keras import layers

    serializable = keras.saving.register_keras_serializable(package="parity_repro_tests")

    @serializable
    class ConverterGelu(layers.Layer):
        """The erf GELU, computed as the tanh GELU while the TFLite converter traces it."""

        def call(self, x):
            return keras.activations.gelu(x, approximate=_converted_to_tflite())

    @serializable
    class Shift(layers.Layer):
        """``(x + 3e4) - 3e4``: x itself in float64, x rounded to float32's spacing at 3e4 in float32."""

        def call(self, x):
            return (x + 3e4) - 3e4

    @serializable
    class Residual(layers.Layer):
        def __init__(self, faulty: bool = False, **kwargs):
            super().__init__(**kwargs)
            self.faulty = faulty
            self.dense = layers.Dense(REPRO_WIDTH, name="dense")
            special = {"gelu": ConverterGelu, "shift": Shift}[activation]
            self.act = special(name="act") if faulty else layers.Activation("tanh", name="act")

        def build(self, input_shape):
            self.dense.build(input_shape)

        def call(self, x):
            return x + self.act(self.dense(x))

        def get_config(self):
            return {**super().get_config(), "faulty": self.faulty}

    keras.utils.set_random_seed(0)
    x = keras.Input((6,), name="x")
    h = layers.Dense(REPRO_WIDTH, name="proj")(x)
    h = keras.Sequential([Residual(i == 1, name=f"block_{i}") for i in range(3)], name="blocks")(h)
    return keras.Model(x, layers.Dense(3, name="head")(h), name=f"{activation}_net")


def make_gelu():
    return _repro_model("gelu")


def make_shift():
    return _repro_model("shift")
