"""mlp: a two-hidden-layer perceptron on the flattened 8x8 digits (64 features, 10 classes)."""

from parity.model.spec import InputSpec, Layer, ModelSpec, ParamSpec, Tolerance, Tolerances, Training

HIDDEN = (64, 32)
CLASSES = 10


def torch_module():
    from torch import nn

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.dense1 = nn.Linear(64, HIDDEN[0])
            self.relu1 = nn.ReLU()
            self.dense2 = nn.Linear(HIDDEN[0], HIDDEN[1])
            self.relu2 = nn.ReLU()
            self.logits = nn.Linear(HIDDEN[1], CLASSES)

        def forward(self, x):
            return self.logits(self.relu2(self.dense2(self.relu1(self.dense1(x)))))

    return MLP()


def keras_model(dtype):
    import keras
    from keras import layers

    x = keras.Input((64,), dtype=dtype, name="x")
    h = layers.ReLU(name="relu1", dtype=dtype)(layers.Dense(HIDDEN[0], name="dense1", dtype=dtype)(x))
    h = layers.ReLU(name="relu2", dtype=dtype)(layers.Dense(HIDDEN[1], name="dense2", dtype=dtype)(h))
    logits = layers.Dense(CLASSES, name="logits", dtype=dtype)(h)
    return keras.Model(x, logits, name="mlp")


def jax_apply(params, x, tap=None):
    import jax

    tap = tap or (lambda name, value: None)

    def dense(name, h):
        out = h @ params[f"{name}/kernel"] + params[f"{name}/bias"]
        tap(name, out)
        return out

    h = jax.nn.relu(dense("dense1", x))
    tap("relu1", h)
    h = jax.nn.relu(dense("dense2", h))
    tap("relu2", h)
    return dense("logits", h)


SPEC = ModelSpec(
    name="mlp",
    description="MLP 64-64-32-10 with ReLU on flattened 8x8 digits",
    input=InputSpec("x", (64,), layout="flat"),
    outputs=("logits",),
    num_classes=CLASSES,
    params={
        "dense1/kernel": ParamSpec((64, HIDDEN[0]), "dense_kernel"),
        "dense1/bias": ParamSpec((HIDDEN[0],), "vector"),
        "dense2/kernel": ParamSpec((HIDDEN[0], HIDDEN[1]), "dense_kernel"),
        "dense2/bias": ParamSpec((HIDDEN[1],), "vector"),
        "logits/kernel": ParamSpec((HIDDEN[1], CLASSES), "dense_kernel"),
        "logits/bias": ParamSpec((CLASSES,), "vector"),
    },
    taps=("dense1", "relu1", "dense2", "relu2", "logits"),
    layers={
        "dense1": Layer("dense"), "relu1": Layer("activation", {"form": "relu"}),
        "dense2": Layer("dense"), "relu2": Layer("activation", {"form": "relu"}),
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
