"""transformer: a 2-block pre-norm encoder on the 8x8 digits read as 8 tokens of 8 features (10 classes).

embed (linear 8->32) -> pos (learned positional embedding, added) -> 2 x [x + attn(norm1(x)),
x + mlp(norm2(x))] -> final_norm -> mean over tokens (pool) -> logits. Attention has 2 heads of
16, scaled by 1/sqrt(16), softmax over the keys (last axis); the MLP is 32->64->32 with exact
(erf) GELU. LayerNorm epsilon is 1e-5 everywhere. Every tap is a top-level layer / submodule.

Keras GELU is written out as 0.5 x (1 + erf(x / sqrt 2)): ``keras.activations.gelu(x, approximate=False)``
calls ``tf.nn.gelu``, which (TF 2.21) builds its 1/sqrt(2) as a float32 constant and casts it, so in
float64 it is off by up to 5e-9 and the float64 cross-framework gate (1e-9) refuses it.
"""

import math

from parity.model.spec import InputSpec, Layer, ModelSpec, ParamSpec, Tolerance, Tolerances, Training

TOKENS, FEATURES = 8, 8
D_MODEL, HEADS, MLP = 32, 2, 64
HEAD_DIM = D_MODEL // HEADS
BLOCKS = 2
CLASSES = 10
EPSILON = 1e-5
SCALE = 1.0 / math.sqrt(HEAD_DIM)
SQRT_HALF = math.sqrt(0.5)
BLOCK_TAPS = ("norm1", "attn", "res1", "norm2", "mlp_in", "gelu", "mlp_out", "res2")  # per block, in order


def torch_module():
    import torch
    from torch import nn

    class Pos(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Parameter(0.02 * torch.randn(TOKENS, D_MODEL))

        def forward(self, x):
            return x + self.embedding

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.query, self.key, self.value, self.out = (nn.Linear(D_MODEL, D_MODEL) for _ in range(4))

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = (p(x).reshape(b, t, HEADS, HEAD_DIM).transpose(1, 2) for p in (self.query, self.key, self.value))
            weights = torch.softmax((q @ k.transpose(-1, -2)) * SCALE, dim=-1)
            return self.out((weights @ v).transpose(1, 2).reshape(b, t, D_MODEL))

    class Add(nn.Module):
        def forward(self, a, b):
            return a + b

    class Mean(nn.Module):
        def forward(self, x):
            return x.mean(dim=1)

    class Transformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(FEATURES, D_MODEL)
            self.pos = Pos()
            for i in range(BLOCKS):  # top-level submodules named like the Keras layers, so each is a tap
                parts = {"norm1": nn.LayerNorm(D_MODEL, eps=EPSILON), "attn": Attention(), "res1": Add(),
                         "norm2": nn.LayerNorm(D_MODEL, eps=EPSILON), "mlp_in": nn.Linear(D_MODEL, MLP),
                         "gelu": nn.GELU(approximate="none"), "mlp_out": nn.Linear(MLP, D_MODEL), "res2": Add()}
                for name, module in parts.items():
                    self.add_module(f"block{i}_{name}", module)
            self.final_norm = nn.LayerNorm(D_MODEL, eps=EPSILON)
            self.pool = Mean()
            self.logits = nn.Linear(D_MODEL, CLASSES)

        def forward(self, x):
            h = self.pos(self.embed(x))
            for i in range(BLOCKS):
                b = {name: self.get_submodule(f"block{i}_{name}") for name in BLOCK_TAPS}
                h = b["res1"](h, b["attn"](b["norm1"](h)))
                h = b["res2"](h, b["mlp_out"](b["gelu"](b["mlp_in"](b["norm2"](h)))))
            return self.logits(self.pool(self.final_norm(h)))

    return Transformer()


def keras_model(dtype):
    import keras
    from keras import layers, ops

    class Pos(layers.Layer):
        def build(self, input_shape):
            self.embedding = self.add_weight(shape=(TOKENS, D_MODEL), name="embedding")

        def call(self, x):
            return x + self.embedding

    class Attention(layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.query, self.key, self.value, self.out = (
                layers.Dense(D_MODEL, name=n, dtype=dtype) for n in ("query", "key", "value", "out"))

        def call(self, x):
            def heads(h):  # any batch size: the batch axis is -1
                return ops.transpose(ops.reshape(h, (-1, TOKENS, HEADS, HEAD_DIM)), (0, 2, 1, 3))

            q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
            weights = ops.softmax(ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))) * SCALE, axis=-1)
            return self.out(ops.reshape(ops.transpose(ops.matmul(weights, v), (0, 2, 1, 3)), (-1, TOKENS, D_MODEL)))

    def gelu(v):  # exact (erf) GELU; not keras.activations.gelu, see the module docstring
        return 0.5 * v * (1.0 + ops.erf(v * SQRT_HALF))

    def norm(name):
        return layers.LayerNormalization(epsilon=EPSILON, name=name, dtype=dtype)

    x = keras.Input((TOKENS, FEATURES), dtype=dtype, name="x")
    h = Pos(name="pos", dtype=dtype)(layers.Dense(D_MODEL, name="embed", dtype=dtype)(x))
    for i in range(BLOCKS):
        a = Attention(name=f"block{i}_attn", dtype=dtype)(norm(f"block{i}_norm1")(h))
        h = layers.Add(name=f"block{i}_res1", dtype=dtype)([h, a])
        m = layers.Dense(MLP, name=f"block{i}_mlp_in", dtype=dtype)(norm(f"block{i}_norm2")(h))
        m = layers.Activation(gelu, name=f"block{i}_gelu", dtype=dtype)(m)
        m = layers.Dense(D_MODEL, name=f"block{i}_mlp_out", dtype=dtype)(m)
        h = layers.Add(name=f"block{i}_res2", dtype=dtype)([h, m])
    h = layers.GlobalAveragePooling1D(name="pool", dtype=dtype)(norm("final_norm")(h))
    logits = layers.Dense(CLASSES, name="logits", dtype=dtype)(h)
    return keras.Model(x, logits, name="transformer")


def jax_apply(params, x, tap=None):
    import jax
    import jax.numpy as jnp

    tap = tap or (lambda name, value: None)

    def tapped(name, value):
        tap(name, value)
        return value

    def dense(name, h, is_tap=True):
        out = h @ params[f"{name}/kernel"] + params[f"{name}/bias"]
        return tapped(name, out) if is_tap else out

    def layer_norm(name, h):
        mean = h.mean(-1, keepdims=True)
        var = ((h - mean) ** 2).mean(-1, keepdims=True)
        return tapped(name, (h - mean) / jnp.sqrt(var + EPSILON) * params[f"{name}/gamma"] + params[f"{name}/beta"])

    def attention(name, h):
        b, t, _ = h.shape
        q, k, v = (dense(f"{name}/{p}", h, False).reshape(b, t, HEADS, HEAD_DIM).transpose(0, 2, 1, 3)
                   for p in ("query", "key", "value"))
        weights = jax.nn.softmax((q @ k.transpose(0, 1, 3, 2)) * SCALE, axis=-1)
        out = dense(f"{name}/out", (weights @ v).transpose(0, 2, 1, 3).reshape(b, t, D_MODEL), False)
        return tapped(name, out)

    h = tapped("pos", dense("embed", x) + params["pos/embedding"])
    for i in range(BLOCKS):
        blk = f"block{i}_"
        h = tapped(blk + "res1", h + attention(blk + "attn", layer_norm(blk + "norm1", h)))
        m = tapped(blk + "gelu", jax.nn.gelu(dense(blk + "mlp_in", layer_norm(blk + "norm2", h)), approximate=False))
        h = tapped(blk + "res2", h + dense(blk + "mlp_out", m))
    h = tapped("pool", layer_norm("final_norm", h).mean(axis=1))
    return dense("logits", h)


def _block_layers(i):
    previous = f"block{i - 1}_res2" if i else "pos"
    b = f"block{i}_"
    return {
        b + "norm1": Layer("layer_norm", {"eps": EPSILON}),
        b + "attn": Layer("attention", {"heads": HEADS, "scale": SCALE}),
        b + "res1": Layer("add", inputs=(previous, b + "attn")),
        b + "norm2": Layer("layer_norm", {"eps": EPSILON}),
        b + "mlp_in": Layer("dense"),
        b + "gelu": Layer("activation", {"form": "gelu_erf"}),
        b + "mlp_out": Layer("dense"),
        b + "res2": Layer("add", inputs=(b + "res1", b + "mlp_out")),
    }


def _dense(name, n_in, n_out):
    return {f"{name}/kernel": ParamSpec((n_in, n_out), "dense_kernel"), f"{name}/bias": ParamSpec((n_out,), "vector")}


def _norm(name):
    return {f"{name}/gamma": ParamSpec((D_MODEL,), "vector"), f"{name}/beta": ParamSpec((D_MODEL,), "vector")}


def _block(i):
    attn = {}
    for p in ("query", "key", "value", "out"):
        attn.update(_dense(f"block{i}_attn/{p}", D_MODEL, D_MODEL))
    return {**_norm(f"block{i}_norm1"), **attn, **_norm(f"block{i}_norm2"),
            **_dense(f"block{i}_mlp_in", D_MODEL, MLP), **_dense(f"block{i}_mlp_out", MLP, D_MODEL)}


SPEC = ModelSpec(
    name="transformer",
    description="pre-norm transformer encoder, 2 blocks, d_model 32, 2 heads, MLP 64, exact GELU; digits as 8 tokens",
    input=InputSpec("x", (TOKENS, FEATURES), layout="tokens"),
    outputs=("logits",),
    num_classes=CLASSES,
    params={
        **_dense("embed", FEATURES, D_MODEL),
        "pos/embedding": ParamSpec((TOKENS, D_MODEL), "tensor"),
        **{k: v for i in range(BLOCKS) for k, v in _block(i).items()},
        **_norm("final_norm"),
        **_dense("logits", D_MODEL, CLASSES),
    },
    taps=("embed", "pos", *(f"block{i}_{t}" for i in range(BLOCKS) for t in BLOCK_TAPS),
          "final_norm", "pool", "logits"),
    layers={
        "embed": Layer("dense"),
        "pos": Layer("position"),
        **{k: v for i in range(BLOCKS) for k, v in _block_layers(i).items()},
        "final_norm": Layer("layer_norm", {"eps": EPSILON}),
        "pool": Layer("mean", {"axis": 1}),
        "logits": Layer("dense"),
    },
    tolerances={"fp32": Tolerances(Tolerance(atol=1e-5, rtol=1e-5))},
    grad_tolerances={"fp32": Tolerances(Tolerance(atol=1e-6, rtol=1e-4))},
    bench_batch_sizes=(1, 64),
    training=Training(epochs=30, lr=3e-3, batch_size=64, seed=0),
    expected_errors={"jax/tf/onnx/*": "jax2tf serialises through XlaCallModule, which tf2onnx cannot convert"},
    torch_module=torch_module,
    keras_model=keras_model,
    jax_apply=jax_apply,
)
