"""Nested models as users bring them, each with ONE leaf made faulty in the exported graph only.

Every model here is a tree of modules (blocks in an ``nn.Sequential``, a Hugging Face encoder's layers, a Keras
functional model used as a layer, a Flax module holding a list of blocks). Exactly one leaf of that tree computes
something else when, and only when, the model is being exported; its native run is correct. A diagnosis that
descends the model's own module tree should end at that leaf; one that compares the top-level taps only can name
no more than the top-level module holding it. Each factory's docstring names the fault, its module path and its
trigger. Weights are seeded and random; LayerNorm / BatchNorm parameters and statistics are random too, so a fault
on a normalisation is visible. Models are returned in eval mode.

What tells a leaf it is being exported:

* torch: ``torch.onnx.is_in_onnx_export()``, True while ``torch.onnx.export`` runs (the dynamo exporter too);
* Keras (tf2onnx) and Flax (jax2onnx): neither converter sets a flag a layer can read. Both trace the Python
  function synchronously (``tf.function.get_concrete_function``, ``jax.make_jaxpr``), so a frame of the
  converter's package is on the Python stack while the layer's ``call`` runs: ``_traced_by(package)``. parity's
  native ``tf`` path (a ``tf.function``), its golden build and its taps (eager) and its native ``jax`` path
  (``jax.jit``) never run under those frames.

Frameworks are imported inside the factories: this file is imported by worker processes by path.
"""

from __future__ import annotations

import sys
from pathlib import Path

VOCAB = 512  # as tests/realmodels.VOCAB: token ids 0 to VOCAB - 1


def _traced_by(package: str) -> bool:
    """True while a function of ``package`` (``tf2onnx``, ``jax2onnx``) is on the Python stack."""
    frame = sys._getframe(1)
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).split(".")[0] == package:
            return True
        frame = frame.f_back
    return False


def _torch_faulty():
    """The torch leaves that compute something else under ``torch.onnx.export`` only (each still an instance of
    the class it replaces, for ``isinstance``)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class ExportEpsLayerNorm(nn.LayerNorm):
        """``nn.LayerNorm``; exported with ``export_eps`` instead of its own ``eps``."""

        def __init__(self, *args, export_eps: float, **kwargs):
            super().__init__(*args, **kwargs)
            self.export_eps = export_eps

        def forward(self, x):
            if torch.onnx.is_in_onnx_export():
                return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.export_eps)
            return super().forward(x)

    class ExportNoBiasLayerNorm(nn.LayerNorm):
        """``nn.LayerNorm``; exported without its bias (beta)."""

        def forward(self, x):
            if torch.onnx.is_in_onnx_export():
                return F.layer_norm(x, self.normalized_shape, self.weight, None, self.eps)
            return super().forward(x)

    return ExportEpsLayerNorm, ExportNoBiasLayerNorm


def _swap_layer_norm(parent, name: str, cls, **kwargs):
    """Replace ``parent.<name>`` (an ``nn.LayerNorm``) by a ``cls`` instance holding the same shape, eps and
    weights."""
    old = getattr(parent, name)
    new = cls(
        old.normalized_shape,
        eps=old.eps,
        elementwise_affine=old.elementwise_affine,
        bias=old.bias is not None,
        **kwargs,
    )
    new.load_state_dict(old.state_dict())
    setattr(parent, name, new)


def _random_norms(model, seed: int = 1):
    """Random gamma/beta on every LayerNorm and BatchNorm, random running statistics on every BatchNorm."""
    import torch
    from torch import nn

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.LayerNorm, nn.BatchNorm2d)):
                if module.weight is not None:
                    module.weight.copy_(torch.rand(module.weight.shape, generator=generator) + 0.5)
                if module.bias is not None:
                    module.bias.copy_(torch.randn(module.bias.shape, generator=generator) * 0.2)
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.copy_(torch.rand(module.running_mean.shape, generator=generator) - 0.5)
                module.running_var.copy_(torch.rand(module.running_var.shape, generator=generator) * 1.5 + 0.5)
    return model.eval()


def make_residual_stack():
    """An MLP of 8 pre-norm residual blocks (``x + GELU(Linear(LayerNorm(x)))``) between an input projection and a
    head: x (2x16) -> output (2x4).

    Fault: ``blocks.5.norm`` (an ``nn.LayerNorm`` subclass, eps 1e-5) is exported with eps 1e-1; triggered by
    ``torch.onnx.is_in_onnx_export()``."""
    import torch
    from torch import nn

    ExportEpsLayerNorm, _ = _torch_faulty()

    class Block(nn.Module):
        def __init__(self, width: int, faulty: bool):
            super().__init__()
            self.norm = ExportEpsLayerNorm(width, export_eps=1e-1) if faulty else nn.LayerNorm(width)
            self.fc = nn.Linear(width, width)
            self.act = nn.GELU()

        def forward(self, x):
            return x + self.act(self.fc(self.norm(x)))

    class ResidualStack(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(16, 32)
            self.blocks = nn.Sequential(*(Block(32, faulty=i == 5) for i in range(8)))
            self.head = nn.Linear(32, 4)

        def forward(self, x):
            return self.head(self.blocks(self.proj(x)))

    torch.manual_seed(0)
    return _random_norms(ResidualStack())


def make_cnn_stages():
    """Three stages, each ``nn.Sequential(Conv2d, BatchNorm2d, ReLU, pool)``, then a head: x (2x3x16x16) -> output
    (2x5).

    Fault: ``features.1.3`` (stage 2's pool), ``nn.AvgPool2d(2, divisor_override=1)``, a sum pool. Nothing is
    injected: torch.onnx exports it as an ``AveragePool`` without the divisor (it divides by 4), a real converter
    bug of the installed torch (as ``tests/converterbugs.make_pool_divisor``)."""
    import torch
    from torch import nn

    def stage(cin: int, cout: int, pool):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(), pool)

    class CnnStages(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(
                stage(3, 8, nn.MaxPool2d(2)),
                stage(8, 8, nn.AvgPool2d(2, divisor_override=1)),
                stage(8, 16, nn.AdaptiveAvgPool2d(1)),
            )
            self.flatten = nn.Flatten()
            self.head = nn.Linear(16, 5)

        def forward(self, x):
            return self.head(self.flatten(self.features(x)))

    torch.manual_seed(0)
    return _random_norms(CnnStages())


def make_faulty_distilbert():
    """A small ``transformers.DistilBertModel`` (dim 32, 2 heads, 3 layers, hidden 64, eager attention):
    input_ids, attention_mask -> last_hidden_state.

    Fault: ``transformer.layer.1.output_layer_norm`` (eps 1e-12, replaced by an ``nn.LayerNorm`` subclass holding
    the same weights) is exported with eps 1e-3 (Keras's default); triggered by ``torch.onnx.is_in_onnx_export()``."""
    import torch
    from transformers import DistilBertConfig, DistilBertModel

    ExportEpsLayerNorm, _ = _torch_faulty()
    torch.manual_seed(0)
    config = DistilBertConfig(
        vocab_size=VOCAB,
        dim=32,
        n_heads=2,
        n_layers=3,
        hidden_dim=64,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    model = _random_norms(DistilBertModel(config))
    _swap_layer_norm(model.transformer.layer[1], "output_layer_norm", ExportEpsLayerNorm, export_eps=1e-3)
    return model.eval()


def make_faulty_vit():
    """A small ``transformers.ViTModel`` (image 16, patch 4, hidden 32, 4 layers, 2 heads, intermediate 64, eager
    attention): pixel_values (2x3x16x16) -> last_hidden_state, pooler_output.

    Fault: the third encoder layer's ``layernorm_before`` loses its bias (beta) in the export; triggered by
    ``torch.onnx.is_in_onnx_export()``. Its module path is ``layers.2.layernorm_before`` in transformers 5
    (``encoder.layer.2.layernorm_before`` in transformers 4): the path is looked up, not assumed."""
    import torch
    from transformers import ViTConfig, ViTModel

    _, ExportNoBiasLayerNorm = _torch_faulty()
    torch.manual_seed(0)
    config = ViTConfig(
        image_size=16,
        patch_size=4,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=2,
        intermediate_size=64,
        attn_implementation="eager",
    )
    model = _random_norms(ViTModel(config))
    layers = model.layers if hasattr(model, "layers") else model.encoder.layer
    _swap_layer_norm(layers[2], "layernorm_before", ExportNoBiasLayerNorm)
    return model.eval()


def make_faulty_bert():
    """A small ``transformers.BertModel`` (as ``tests/realmodels.make_bert``; weights drawn with std 0.2 rather than
    0.02 so that the GELU's inputs reach the range where its two forms differ): input_ids, attention_mask,
    token_type_ids -> last_hidden_state, pooler_output.

    Fault: ``encoder.layer.1.intermediate.intermediate_act_fn`` (``transformers.activations.GELUActivation``, erf
    GELU) computes the tanh approximation in the export; triggered by ``torch.onnx.is_in_onnx_export()``."""
    import torch
    import torch.nn.functional as F
    from transformers import BertConfig, BertModel
    from transformers.activations import GELUActivation

    class ExportTanhGELU(GELUActivation):
        """BERT's erf GELU; exported as the tanh approximation."""

        def forward(self, x):
            if torch.onnx.is_in_onnx_export():
                return F.gelu(x, approximate="tanh")
            return super().forward(x)

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        initializer_range=0.2,
        attn_implementation="eager",
    )
    model = _random_norms(BertModel(config))
    model.encoder.layer[1].intermediate.intermediate_act_fn = ExportTanhGELU()
    return model.eval()


def make_faulty_gpt2():
    """A small ``transformers.GPT2Model`` without its key/value cache (2 layers, 32 wide, weights drawn with std 0.2
    so that the GELU's inputs reach the range where its two forms differ): input_ids, attention_mask ->
    last_hidden_state.

    Fault: ``h.1.mlp.act`` (``transformers.activations.NewGELUActivation``, the tanh GELU) computes the exact erf
    GELU in the export; triggered by ``torch.onnx.is_in_onnx_export()``."""
    import torch
    import torch.nn.functional as F
    from transformers import GPT2Config, GPT2Model
    from transformers.activations import NewGELUActivation

    class ExportErfGELU(NewGELUActivation):
        """GPT-2's tanh GELU; exported as the exact (erf) GELU."""

        def forward(self, x):
            if torch.onnx.is_in_onnx_export():
                return F.gelu(x)
            return super().forward(x)

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=2,
        use_cache=False,
        initializer_range=0.2,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",
    )
    model = _random_norms(GPT2Model(config))
    model.h[1].mlp.act = ExportErfGELU()
    return model.eval()


def _keras_faulty_layer_norm():
    import keras

    @keras.saving.register_keras_serializable(package="nestedmodels")
    class ExportEpsLayerNormalization(keras.layers.LayerNormalization):
        """``LayerNormalization`` (last axis); while tf2onnx traces it, computed with ``export_epsilon``."""

        def __init__(self, export_epsilon: float = 1e-1, **kwargs):
            super().__init__(**kwargs)
            self.export_epsilon = export_epsilon

        def call(self, inputs):
            if not _traced_by("tf2onnx"):
                return super().call(inputs)
            ops = keras.ops
            mean = ops.mean(inputs, axis=-1, keepdims=True)
            variance = ops.mean(ops.square(inputs - mean), axis=-1, keepdims=True)
            return (inputs - mean) / ops.sqrt(variance + self.export_epsilon) * self.gamma + self.beta

        def get_config(self):
            return {**super().get_config(), "export_epsilon": self.export_epsilon}

    return ExportEpsLayerNormalization


def make_keras_nested():
    """A functional Keras model holding a functional sub-model (``encoder``) and a ``keras.Sequential`` block
    (``mlp``) as layers: x (2x12) -> output (2x3).

    Fault: ``encoder/norm`` (a ``LayerNormalization`` subclass, epsilon 1e-3) is computed with epsilon 1e-1 while
    tf2onnx traces it (``_traced_by("tf2onnx")``: parity's ``tf/onnx/*`` paths); the native ``tf`` path, the golden
    build and the taps compute it as declared."""
    import keras
    from keras import layers

    ExportEpsLayerNormalization = _keras_faulty_layer_norm()
    keras.utils.set_random_seed(0)
    gamma, beta = keras.initializers.RandomUniform(0.5, 1.5), keras.initializers.RandomNormal(stddev=0.2)
    inner_x = keras.Input((16,), name="encoder_in")
    h = layers.Dense(16, activation="tanh", name="dense")(inner_x)
    h = ExportEpsLayerNormalization(
        export_epsilon=1e-1, epsilon=1e-3, gamma_initializer=gamma, beta_initializer=beta, name="norm"
    )(h)
    encoder = keras.Model(inner_x, layers.Dense(16, name="out")(h), name="encoder")
    mlp = keras.Sequential(
        [
            layers.Dense(24, activation="relu", name="fc1"),
            layers.LayerNormalization(gamma_initializer=gamma, beta_initializer=beta, name="ln"),
            layers.Dense(16, name="fc2"),
        ],
        name="mlp",
    )
    x = keras.Input((12,), name="x")
    h = layers.Dense(16, name="proj")(x)
    h = mlp(encoder(h))
    return keras.Model(x, layers.Dense(3, name="head")(h), name="keras_nested")


def save_keras_nested(path) -> Path:
    """``make_keras_nested()`` saved as ``.keras`` (its custom layer registered, so ``keras.models.load_model``
    loads it once this file is imported)."""
    path = Path(path)
    make_keras_nested().save(path)
    return path


FLAX_BLOCKS, FLAX_FAULTY_BLOCK, FLAX_WIDTH = 6, 3, 16


def _flax_net():
    import flax.linen as nn
    import jax.numpy as jnp

    class ExportEpsLayerNorm(nn.LayerNorm):
        """``nn.LayerNorm`` over the last axis; while jax2onnx traces it, computed with ``export_epsilon``. Its
        own ``__call__``, so jax2onnx's patch of ``nn.LayerNorm.__call__`` does not replace it."""

        export_epsilon: float = 1e-1

        @nn.compact
        def __call__(self, x, *, mask=None):
            eps = self.export_epsilon if _traced_by("jax2onnx") else self.epsilon
            scale = self.param("scale", self.scale_init, (x.shape[-1],), self.param_dtype)
            bias = self.param("bias", self.bias_init, (x.shape[-1],), self.param_dtype)
            mean = x.mean(axis=-1, keepdims=True)
            variance = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
            return (x - mean) / jnp.sqrt(variance + eps) * scale + bias

    class Block(nn.Module):
        faulty: bool = False

        @nn.compact
        def __call__(self, x):
            h = jnp.tanh(nn.Dense(FLAX_WIDTH, name="dense")(x))
            norm = ExportEpsLayerNorm(name="norm") if self.faulty else nn.LayerNorm(name="norm")
            return x + norm(h)

    class NestedNet(nn.Module):
        def setup(self):
            self.proj = nn.Dense(FLAX_WIDTH)
            self.blocks = [Block(faulty=i == FLAX_FAULTY_BLOCK) for i in range(FLAX_BLOCKS)]  # blocks_0, blocks_1...
            self.head = nn.Dense(3)

        def __call__(self, x, tap=None):
            h = self.proj(x)
            if tap is not None:
                tap("proj", h)
            for i, block in enumerate(self.blocks):
                h = block(h)
                if tap is not None:
                    tap(f"blocks_{i}", h)
            return self.head(h)

    return NestedNet()


def flax_apply(params, x, tap=None):
    """A Flax linen MLP of 6 residual blocks (``x + LayerNorm(tanh(Dense(x)))``) between a projection and a head,
    as ``parity init --jax`` takes it: x (2x12) -> output (2x3); taps ``proj``, ``blocks_0`` ... ``blocks_5``.

    Fault: ``blocks_3/norm`` (an ``nn.LayerNorm`` subclass, epsilon 1e-6) is computed with epsilon 1e-1 while
    jax2onnx traces it (``_traced_by("jax2onnx")``: parity's ``jax/onnx/*`` paths); ``jax.jit`` (the native
    ``jax`` path, the golden build, the taps) and jax2tf compute it as declared."""
    return _flax_net().apply({"params": params}, x, tap)


def save_flax_params(path) -> Path:
    """The Flax model's parameters from ``init`` (seed 0; every LayerNorm's scale and bias random), flattened to
    ``blocks_3/norm/scale``-style keys in a ``.npz``."""
    import jax
    import numpy as np

    variables = _flax_net().init(jax.random.PRNGKey(0), np.zeros((1, 12), np.float32))
    flat = {
        "/".join(str(getattr(k, "key", k)) for k in key): np.asarray(value)
        for key, value in jax.tree_util.tree_flatten_with_path(variables["params"])[0]
    }
    rng = np.random.default_rng(1)
    for key, value in flat.items():
        if "/norm/" in key:
            flat[key] = (
                value + rng.uniform(-0.5, 0.5, value.shape)
                if key.endswith("scale")
                else rng.normal(0.0, 0.2, value.shape)
            ).astype(np.float32)
    path = Path(path)
    np.savez(path, **flat)
    return path
