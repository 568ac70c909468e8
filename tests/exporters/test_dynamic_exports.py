"""Exports keep the spec's named axes (batch, sequence) dynamic and record it in ``meta["axes"]``: real exports
(torch.onnx, tf2onnx, jax2onnx, jax2tf) run in ONNX Runtime / TensorFlow at shapes other than the traced one."""

from __future__ import annotations

import numpy as np
import pytest

from parity.exporters.common import ExportJob
from parity.golden import store
from parity.model.spec import InputSpec, ModelSpec, ParamSpec, Values
from parity.model.workspace import Workspace
from parity.runtimes.onnx_common import onnx_feed
from tests.conftest import REPO

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

ATOL = 1e-4
VOCAB, WIDTH, CLASSES = 11, 8, 3


def _zoo(model: str):
    ws = Workspace(REPO)
    spec = ws.load_spec(model)
    return spec, store.load(ws.golden_dir(model), spec).arrays


def _job(spec, weights, inputs, out_dir, batch_size=None, **extra) -> ExportJob:
    return ExportJob(
        spec=spec,
        weights=weights,
        batch_size=batch_size or spec.batch_size,
        opset=spec.opset,
        out_dir=out_dir,
        inputs=inputs,
        **extra,
    )


def _session(out_dir, meta):
    return ort.InferenceSession(str(out_dir / meta["file"]), providers=["CPUExecutionProvider"])


def _graph_dims(out_dir, meta) -> dict:
    model = onnx.load(str(out_dir / meta["file"]))
    return {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}


EXPORTERS = {
    "torch.onnx": ("torch", "parity.exporters.torch_onnx", "export"),
    "tf2onnx": ("tensorflow", "parity.exporters.tf_onnx", "export_keras"),
    "jax2onnx": ("jax2onnx", "parity.exporters.jax_onnx", "export"),
}


def _exporter(name):
    import importlib

    framework, module, function = EXPORTERS[name]
    pytest.importorskip(framework)
    return getattr(importlib.import_module(module), function)


# --------------------------------------------------------------------------- the zoo: a dynamic batch


@pytest.mark.parametrize(
    "model, exporter", [("mlp", "torch.onnx"), ("mlp", "tf2onnx"), ("mlp", "jax2onnx"), ("cnn", "tf2onnx")]
)
def test_zoo_export_has_a_dynamic_batch(tmp_path, model, exporter):
    spec, arrays = _zoo(model)
    meta = _exporter(exporter)(_job(spec, arrays["weights.npz"], {"x": arrays["inputs.npz"]["x"]}, tmp_path))

    assert meta["axes"] == {"dynamic": {"x": {"0": "batch"}}, "static": {}, "reason": None}
    assert meta["input_names"] and meta["output_names"] and meta["format"] == "onnx"  # the keys kept
    graph_input = meta["input_names"][0]
    assert _graph_dims(tmp_path, meta)[graph_input][0] == "batch"  # named by the axis name, not unk__N
    session = _session(tmp_path, meta)
    evals, golden = arrays["eval.npz"]["x"], arrays["reference.npz"]["eval/logits"]
    for n in (1, 3, spec.batch_size):
        (logits,) = session.run(meta["output_names"][:1], onnx_feed(spec, meta, {"x": evals[:n]}))
        assert logits.shape == golden[:n].shape
        np.testing.assert_allclose(logits, golden[:n], rtol=0, atol=ATOL, err_msg=f"batch {n}")


def test_zoo_jax2tf_savedmodel_has_a_dynamic_batch(tmp_path):
    tf = pytest.importorskip("tensorflow")
    pytest.importorskip("jax")
    from parity.exporters import jax_tf

    spec, arrays = _zoo("mlp")
    meta = jax_tf.export(_job(spec, arrays["weights.npz"], {"x": arrays["inputs.npz"]["x"]}, tmp_path))

    assert meta["axes"] == {"dynamic": {"x": {"0": "batch"}}, "static": {}, "reason": None}
    assert meta["format"] == "tf-savedmodel" and meta["param_names"] == list(spec.params)
    loaded = tf.saved_model.load(str(tmp_path))
    assert loaded.forward.input_signature[0].shape.as_list() == [None, 64]
    evals, golden = arrays["eval.npz"]["x"], arrays["reference.npz"]["eval/logits"]
    for n in (1, 3):
        with tf.GradientTape() as tape:
            (logits,) = loaded.forward(tf.constant(evals[:n]))
            loss = tf.reduce_sum(logits * logits)
        np.testing.assert_allclose(logits.numpy(), golden[:n], rtol=0, atol=ATOL, err_msg=f"batch {n}")
        assert all(g is not None for g in tape.gradient(loss, loaded.param_list))  # the gradient is saved too


# --------------------------------------------------------------------------- two inputs and a named sequence axis


try:  # the hand-made torch models are module-level classes; without torch their tests skip
    import torch
    from torch import nn
except ImportError:  # pragma: no cover - torch is a project dependency
    torch = nn = None

if torch is not None:

    class Tokens(nn.Module):
        """Two inputs sharing batch and sequence: an embedding, a masked mean over the tokens, a linear head."""

        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, WIDTH)
            self.head = nn.Linear(WIDTH, CLASSES)

        def forward(self, input_ids, attention_mask):
            mask = attention_mask.unsqueeze(-1).to(torch.float32)
            pooled = (self.embed(input_ids) * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
            return self.head(pooled)

    class FixedBatch(Tokens):
        """Adds a per-row offset for 4 rows: the batch must be 4, so torch.export cannot keep it dynamic."""

        def forward(self, input_ids, attention_mask):
            return super().forward(input_ids, attention_mask) + torch.arange(4.0).unsqueeze(-1)


def _token_module():
    torch.manual_seed(0)
    return Tokens()


def _fixed_batch_module():
    torch.manual_seed(0)
    return FixedBatch()


def _token_spec(batch_size: int = 4, sequence: int = 6, module=_token_module) -> ModelSpec:
    spec = ModelSpec(
        name="tokens",
        description="embedding + masked mean + linear head",
        input=(
            InputSpec(
                "input_ids", ("sequence",), layout="tokens", dtype="int64", values=Values("integers", high=VOCAB)
            ),
            InputSpec("attention_mask", ("sequence",), layout="tokens", dtype="int64", values=Values("mask")),
        ),
        outputs=("logits",),
        axes={"sequence": sequence},
        batch_size=batch_size,
        weights_from_model=True,
        loss=None,
        params={
            "embed.weight": ParamSpec((VOCAB, WIDTH)),
            "head.weight": ParamSpec((CLASSES, WIDTH)),
            "head.bias": ParamSpec((CLASSES,)),
        },
        torch_module=module,
    )
    spec.validate()
    return spec


def _token_feeds(rng, batch: int, sequence: int) -> dict:
    ids = rng.integers(0, VOCAB, size=(batch, sequence), dtype=np.int64)
    mask = np.ones((batch, sequence), dtype=np.int64)
    for row in range(1, batch):
        mask[row, rng.integers(1, sequence + 1) :] = 0  # padded tails, each row keeps a 1
    return {"input_ids": ids, "attention_mask": mask}


def _torch_outputs(module, feeds: dict) -> np.ndarray:
    with torch.no_grad():
        return module(**{k: torch.from_numpy(v) for k, v in feeds.items()}).numpy()


@pytest.mark.parametrize("batch_size, sequence", [(4, 6), (1, 1)])
def test_torch_two_inputs_share_dynamic_batch_and_sequence(tmp_path, batch_size, sequence):
    if torch is None:
        pytest.skip("torch is not installed")
    from parity.exporters import torch_onnx

    spec = _token_spec(batch_size, sequence)
    module = _token_module().eval()
    weights = {k: v.detach().numpy().copy() for k, v in module.state_dict().items()}
    rng = np.random.default_rng(0)
    meta = torch_onnx.export(_job(spec, weights, _token_feeds(rng, batch_size, sequence), tmp_path))

    named = {"0": "batch", "1": "sequence"}
    assert meta["axes"] == {"dynamic": {"input_ids": named, "attention_mask": named}, "static": {}, "reason": None}
    assert meta["input_names"] == ["input_ids", "attention_mask"] and meta["output_names"] == ["logits"]
    dims = _graph_dims(tmp_path, meta)
    assert dims["input_ids"] == dims["attention_mask"] == ["batch", "sequence"]  # one symbol per axis name
    session = _session(tmp_path, meta)
    for batch, length in ((3, 9), (1, 2), (5, 1)):
        feeds = _token_feeds(rng, batch, length)
        (logits,) = session.run(["logits"], feeds)
        np.testing.assert_allclose(
            logits, _torch_outputs(module, feeds), rtol=0, atol=1e-5, err_msg=f"batch {batch}, sequence {length}"
        )


def test_torch_records_why_an_axis_was_specialised(tmp_path):
    """torch.onnx exports again with the axis torch.export specialised made static (and the others dynamic):
    the record says which, and torch.export's own message why."""
    if torch is None:
        pytest.skip("torch is not installed")
    from parity.exporters import torch_onnx

    spec = _token_spec(4, 6, module=_fixed_batch_module)
    module = _fixed_batch_module().eval()
    weights = {k: v.detach().numpy().copy() for k, v in module.state_dict().items()}
    rng = np.random.default_rng(1)
    meta = torch_onnx.export(_job(spec, weights, _token_feeds(rng, 4, 6), tmp_path))

    axes = meta["axes"]
    fixed = {"0": {"axis": "batch", "size": 4}}
    assert axes["static"] == {"input_ids": fixed, "attention_mask": fixed}
    assert axes["dynamic"] == {"input_ids": {"1": "sequence"}, "attention_mask": {"1": "sequence"}}
    reason = axes["reason"]
    assert reason.startswith("torch.export specialised the dynamic axes") and "\n" not in reason and len(reason) <= 300
    assert "specialized it to be a constant (4)" in reason
    session = _session(tmp_path, meta)
    for length in (6, 2):  # the batch is fixed, the sequence still is not
        feeds = _token_feeds(rng, 4, length)
        (logits,) = session.run(["logits"], feeds)
        np.testing.assert_allclose(logits, _torch_outputs(module, feeds), rtol=0, atol=1e-5)


# --------------------------------------------------------------------------- a SavedModel's own signature


@pytest.mark.parametrize("saved_batch", [None, 64])
def test_tf2onnx_follows_the_savedmodels_signature(tmp_path, saved_batch):
    tf = pytest.importorskip("tensorflow")
    pytest.importorskip("tf2onnx")
    from parity.exporters import tf_onnx

    spec, arrays = _zoo("mlp")
    weights = arrays["weights.npz"]
    module = tf.Module()
    module.v = [tf.Variable(weights[name]) for name in spec.params]

    @tf.function(input_signature=[tf.TensorSpec((saved_batch, 64), tf.float32, name="x")])
    def forward(x):
        h = tf.nn.relu(x @ module.v[0] + module.v[1])
        h = tf.nn.relu(h @ module.v[2] + module.v[3])
        return (h @ module.v[4] + module.v[5],)

    module.forward = forward
    saved = tmp_path / "saved"
    tf.saved_model.save(module, str(saved))
    out = tmp_path / "onnx"
    out.mkdir()
    meta = tf_onnx.export_saved_model(
        _job(
            spec, weights, {"x": arrays["inputs.npz"]["x"]}, out, parent_dir=saved, parent_meta={"input_layout": "flat"}
        )
    )

    evals, golden = arrays["eval.npz"]["x"], arrays["reference.npz"]["eval/logits"]
    session = _session(out, meta)
    if saved_batch is None:
        assert meta["axes"] == {"dynamic": {"x": {"0": "batch"}}, "static": {}, "reason": None}
        sizes = (1, 3)
    else:
        assert meta["axes"] == {
            "dynamic": {},
            "static": {"x": {"0": {"axis": "batch", "size": 64}}},
            "reason": "tf2onnx kept the SavedModel's static signature (x axis 0 is 64)",
        }
        sizes = (64,)
    for n in sizes:
        (logits,) = session.run(None, onnx_feed(spec, meta, {"x": evals[:n]}))
        np.testing.assert_allclose(logits, golden[:n], rtol=0, atol=ATOL)


# --------------------------------------------------------------------------- JAX shape polymorphism refused


def _rows_of_four(params, x, tap=None):
    """Sums the batch in groups of rows into 4 rows: only a batch that is a multiple of 4 reshapes."""
    return x.reshape(4, -1, 8).sum(1) @ params["dense/kernel"]


@pytest.mark.parametrize("exporter", ["jax2onnx", "jax2tf"])
def test_jax_exporters_fall_back_static_with_the_reason(tmp_path, exporter):
    pytest.importorskip("jax")
    pytest.importorskip("jax2onnx" if exporter == "jax2onnx" else "tensorflow")
    import importlib

    spec = ModelSpec(
        name="rows",
        description="groups of rows",
        input=InputSpec("x", (8,)),
        outputs=("logits",),
        num_classes=3,
        params={"dense/kernel": ParamSpec((8, 3), "dense_kernel")},
        batch_size=8,
        jax_apply=_rows_of_four,
    )
    spec.validate()
    rng = np.random.default_rng(0)
    weights = {"dense/kernel": rng.standard_normal((8, 3)).astype(np.float32)}
    x = rng.standard_normal((8, 8)).astype(np.float32)
    module = importlib.import_module("parity.exporters." + ("jax_onnx" if exporter == "jax2onnx" else "jax_tf"))
    meta = module.export(_job(spec, weights, {"x": x}, tmp_path))

    axes = meta["axes"]
    assert axes["dynamic"] == {} and axes["static"] == {"x": {"0": {"axis": "batch", "size": 8}}}
    assert axes["reason"].startswith(f"{exporter} could not ") and "InconclusiveDimensionOperation" in axes["reason"]
    assert "\n" not in axes["reason"] and len(axes["reason"]) <= 300
    expected = x.reshape(4, 2, 8).sum(1) @ weights["dense/kernel"]
    if exporter == "jax2onnx":
        (logits,) = _session(tmp_path, meta).run(None, {meta["input_names"][0]: x})
    else:
        import tensorflow as tf

        loaded = tf.saved_model.load(str(tmp_path))  # held: the function needs its variables alive
        logits = loaded.forward(tf.constant(x))[0].numpy()
    np.testing.assert_allclose(logits, expected, rtol=0, atol=1e-5)
