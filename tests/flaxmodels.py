"""Flax models as users bring them (``parity init --jax module:apply,params.npz``), each with one leaf that departs on
``jax/onnx/*`` through a real jax2onnx behaviour, not an injected fault: ``jax.image.resize(..., "cubic",
antialias=False)`` is exported as an ONNX ``Resize`` in cubic mode with ONNX's default coefficient (a = -0.75),
where JAX interpolates with Keys' cubic (a = -0.5): about 3% of the values' range apart, everywhere.

* ``fpn_apply``: a ``flax.linen`` feature-pyramid network; modules defined in ``setup`` (lists of stages and lateral
  convolutions), a ``top_down`` module called on a list of feature maps that returns a list (its ``up_<i>``
  up-samplers, called with two arrays, are the leaves; the list starts with the coarsest level as it came in),
  and one head shared by every pyramid level; a dict of two outputs. ``fpn_jax2tf_apply``: the same network with
  an injected fault on ``jax/tf`` (jax2tf computes JAX's resize exactly): ``top_down/up_1`` resizes bilinearly while
  jax2tf converts it.
* ``nnx_apply``: a ``flax.nnx`` model (``nnx.Module`` subclasses holding ``nnx.Conv``, ``nnx.LayerNorm``,
  ``nnx.RMSNorm``, ``nnx.Linear``, a list of blocks), rebuilt from its graphdef and the user's weights with
  ``nnx.merge`` inside the function; ``blocks/1/up`` up-samples with the cubic resize.
* ``offset_apply``: a ``flax.linen`` MLP of residual blocks (``x + LayerNorm(Dense(x))``) whose one block's Dense has
  a bias of ``OFFSET``: Flax's LayerNorm (``use_fast_variance``: E[x^2] - E[x]^2) loses its variance to cancellation
  in float32 there, and only there (a departure of float32 itself, on every path).
* ``embed_apply``: token ids -> ``embed`` (a Flax ``Embed``) -> tanh -> Dense ``head``.

Parity loads these functions by path, so this module imports nothing of ``tests``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

FPN_INPUT = (1, 16, 16, 3)
NNX_INPUT = (1, 6, 6, 4)
WIDTH, OFFSET, VOCAB = 8, 300.0, 20  # offset_apply's and embed_apply's width, the far bias, embed_apply's vocabulary


def _cubic(x, height: int, width: int, method: str = "cubic"):
    import jax

    return jax.image.resize(x, (x.shape[0], height, width, x.shape[3]), method, antialias=False)


def _traced_by_jax2tf() -> bool:
    frame = sys._getframe(1)
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).startswith("jax.experimental.jax2tf"):
            return True
        frame = frame.f_back
    return False


def _fpn(jax2tf_fault: bool = False):
    import flax.linen as nn

    class Stage(nn.Module):
        features: int

        @nn.compact
        def __call__(self, x):
            x = nn.Conv(self.features, (3, 3), strides=2, padding="SAME", name="conv")(x)
            return nn.relu(nn.LayerNorm(name="norm")(x))

    class Upsample(nn.Module):
        method: str

        @nn.compact
        def __call__(self, x, like):
            faulty = jax2tf_fault and self.method == "cubic" and _traced_by_jax2tf()
            return _cubic(x, like.shape[1], like.shape[2], "linear" if faulty else self.method)

    class TopDown(nn.Module):
        levels: int

        def setup(self):
            self.ups = [Upsample("nearest" if i == 0 else "cubic", name=f"up_{i}") for i in range(self.levels - 1)]

        def __call__(self, features: list):
            """The pyramid from its top: the coarsest level as it came in, then each finer one merged."""
            merged = [features[-1]]
            for index in range(len(features) - 2, -1, -1):
                merged.append(features[index] + self.ups[index](merged[-1], features[index]))
            return merged

    class FPN(nn.Module):
        def setup(self):
            self.stages = [Stage(c) for c in (8, 12, 16)]
            self.laterals = [nn.Conv(8, (1, 1)) for _ in range(3)]
            self.top_down = TopDown(3)
            self.head = nn.Conv(4, (3, 3), padding="SAME")

        def __call__(self, x):
            features = []
            for stage in self.stages:
                x = stage(x)
                features.append(x)
            pyramid = self.top_down([lateral(f) for lateral, f in zip(self.laterals, features)])
            heads = [self.head(p) for p in pyramid]
            return {"fine": heads[-1], "coarse": heads[0].mean(axis=(1, 2))}

    return FPN()


def fpn_apply(params, x):
    """The FPN: x (1x16x16x3, NHWC) -> ``fine`` (1x8x8x4) and ``coarse`` (1x4). ``top_down/up_1`` resizes by
    bicubic interpolation (``up_0``, the finest, by nearest neighbour, which jax2onnx exports exactly): ``jax/onnx/*``
    departs there."""
    return _fpn().apply({"params": params}, x)


def fpn_jax2tf_apply(params, x):
    """The FPN (``fpn_apply``'s weights) whose ``top_down/up_1`` resizes bilinearly while jax2tf converts it: an
    injected fault (jax2tf runs JAX's own cubic resize exactly), so ``jax/tf`` departs there."""
    return _fpn(jax2tf_fault=True).apply({"params": params}, x)


def _flat(tree, prefix: str = "") -> dict:
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in _flat(sub, f"{prefix}{key}/").items()}
    return {prefix.rstrip("/"): tree}


def save_fpn_params(path) -> Path:
    import jax

    variables = _fpn().init(jax.random.PRNGKey(0), np.zeros(FPN_INPUT, np.float32))
    np.savez(path, **_flat(jax.tree_util.tree_map(np.asarray, dict(variables["params"]))))
    return Path(path)


def _nnx_net(seed: int = 0):
    import jax
    from flax import nnx

    class Upsample(nnx.Module):
        def __call__(self, x):
            return _cubic(x, 2 * x.shape[1], 2 * x.shape[2])

    class Block(nnx.Module):
        def __init__(self, channels: int, up: bool, rngs):
            self.conv = nnx.Conv(channels, channels, (3, 3), rngs=rngs)
            self.norm = nnx.LayerNorm(channels, rngs=rngs)
            self.up = Upsample() if up else None

        def __call__(self, x):
            y = x + jax.nn.gelu(self.norm(self.conv(x)))
            return self.up(y) if self.up is not None else y

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.stem = nnx.Conv(4, 8, (3, 3), rngs=rngs)
            self.blocks = nnx.List([Block(8, i == 1, rngs) for i in range(3)])
            self.norm = nnx.RMSNorm(8, rngs=rngs)
            self.head = nnx.Linear(8, 5, rngs=rngs)

        def __call__(self, x):
            h = self.stem(x)
            for block in self.blocks:
                h = block(h)
            return self.head(self.norm(h).mean(axis=(1, 2)))

    return Net(nnx.Rngs(seed))


def nnx_apply(params, x):
    """The nnx model: x (1x6x6x4, NHWC) -> (1x5), rebuilt with ``nnx.merge`` from its graphdef and ``params`` (the
    user's nested weights, list indices as strings). ``blocks/1/up`` departs on ``jax/onnx/*``."""
    import jax
    from flax import nnx

    graphdef, state = nnx.split(nnx.eval_shape(_nnx_net))
    flat = {tuple(int(k) if k.isdigit() else k for k in key.split("/")): v for key, v in _flat(params).items()}
    for path, variable in nnx.to_flat_state(state):
        variable.set_value(jax.numpy.asarray(flat[path]))
    return nnx.merge(graphdef, state)(x)


def save_nnx_params(path) -> Path:
    from flax import nnx

    _, state = nnx.split(_nnx_net())
    rng = np.random.default_rng(3)
    weights = {}
    for key, variable in nnx.to_flat_state(state):
        value = np.asarray(variable.get_value())
        if key[-1] in ("scale", "bias"):  # norms and biases away from their initial ones and zeros
            value = value + 0.2 * rng.standard_normal(value.shape)
        weights["/".join(str(k) for k in key)] = value.astype(np.float32)
    np.savez(path, **weights)
    return Path(path)


def _offset_net(blocks: int):
    import flax.linen as nn

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            return x + nn.LayerNorm(name="norm")(nn.Dense(WIDTH, name="dense")(x))

    class OffsetNet(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.Dense(WIDTH, name="proj")(x)
            for i in range(blocks):
                h = Block(name=f"blocks_{i}")(h)
            return nn.Dense(3, name="head")(h)

    return OffsetNet()


def offset_apply(params, x, tap=None):
    """A Flax MLP of residual blocks ``blocks_<i>`` (as many as ``params`` holds): x (2x6) -> (2x3); the block that
    ``save_offset_params`` gave a far bias departs in float32."""
    return _offset_net(sum(name.startswith("blocks_") for name in params)).apply({"params": params}, x)


def save_offset_params(path, blocks: int, far: int) -> Path:
    """``offset_apply``'s weights for ``blocks`` blocks, ``blocks_<far>/dense``'s bias raised by ``OFFSET``."""
    import jax

    variables = _offset_net(blocks).init(jax.random.PRNGKey(0), np.zeros((1, 6), np.float32))
    flat = _flat(jax.tree_util.tree_map(np.asarray, dict(variables["params"])))
    flat[f"blocks_{far}/dense/bias"] = flat[f"blocks_{far}/dense/bias"] + np.float32(OFFSET)
    np.savez(path, **flat)
    return Path(path)


def _embed_net():
    import flax.linen as nn

    class EmbedNet(nn.Module):
        @nn.compact
        def __call__(self, ids):
            return nn.Dense(3, name="head")(nn.tanh(nn.Embed(VOCAB, WIDTH, name="embed")(ids)))

    return EmbedNet()


def embed_apply(params, x, tap=None):
    """Token ids (2x6, below ``VOCAB``) -> ``embed`` (a Flax ``Embed``) -> tanh -> Dense ``head``."""
    return _embed_net().apply({"params": params}, x)


def save_embed_params(path) -> Path:
    import jax

    variables = _embed_net().init(jax.random.PRNGKey(0), np.zeros((2, 6), np.int32))
    np.savez(path, **_flat(jax.tree_util.tree_map(np.asarray, dict(variables["params"]))))
    return Path(path)
