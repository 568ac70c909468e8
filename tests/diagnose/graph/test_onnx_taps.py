"""Taps inside exported ONNX graphs (torch.onnx metadata, tf2onnx names, jax2onnx values), and ONNX
Runtime against onnx.reference node by node, on real exports of the built-in cnn and transformer
(the graph plumbing on small hand-made graphs: test_onnx_graph.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from parity.diagnose.graph import onnx_graph as og
from parity.diagnose.graph import onnx_taps as ot
from parity.golden import store as golden
from parity.model.workspace import Workspace
from parity.pipeline import orchestrate
from parity.run import paths
from parity.runtimes.onnx_common import onnx_feed
from tests.conftest import worker_pool

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

REPO = Path(__file__).resolve().parents[3]
MODELS = ("cnn", "transformer")
PATH_OF = {"torch.onnx": "torch/onnx/ort", "tf2onnx": "tf/onnx/ort", "jax2onnx": "jax/onnx/ort"}
HOW = {"torch.onnx": "metadata", "tf2onnx": "name", "jax2onnx": "value"}
# what the real exports do, as observed: torch.onnx folds each BatchNorm into the preceding Conv
# (the Conv node carries the BatchNorm's scope) and drops the inference-time Dropout
FUSED = {("cnn", "torch.onnx"): {"conv1": "bn1", "conv2": "bn2"}}
IDENTITY = {"cnn": {"dropout": "flatten"}}  # no node in any export: the same tensor as flatten


class Artifact:
    def __init__(self, spec, entry):
        self.spec = spec
        self.meta = entry["meta"]
        model = onnx.load(str(Path(entry["dir"]) / entry["meta"]["file"]))
        reference = np.load(REPO / "golden" / spec.name / "reference.npz")
        self.golden = {tap: reference[f"tap/{tap}"] for tap in spec.taps}
        x = np.load(REPO / "golden" / spec.name / "inputs.npz")["x"]
        self.feed = onnx_feed(spec, self.meta, {spec.model_inputs[0].name: x})
        self.model = og.pinned(model, self.feed)
        self.layout = self.meta["input_layout"]

    def candidates(self):
        return ot.candidate_names(self.model, self.spec, self.golden, self.layout)

    def values(self, model=None):
        model = model or self.model
        return og.run_tensors("ort", model, self.feed, ot.candidate_names(model, self.spec, self.golden, self.layout))

    def map(self, exporter, model=None, values=None):
        model = model or self.model
        values = self.values(model) if values is None else values
        return ot.map_taps(model, self.spec, exporter, self.golden, values, self.layout)


@pytest.fixture(scope="module")
def artifacts(export_cache):
    """The six exports (one worker per framework, in turn), shared by the module."""
    ws = Workspace(REPO)
    out = {}
    with worker_pool() as pool:
        for exporter, path_id in PATH_OF.items():
            path = paths.by_id(path_id)
            reason = paths.unavailable_reason(path)
            for model in MODELS:
                if reason:
                    out[(model, exporter)] = reason
                    continue
                spec = ws.load_spec(model)
                manifest = golden.verify(ws.golden_dir(model), spec)
                run = orchestrate.Run(ws, orchestrate.Options(threads=1))
                entry = run._export(pool, spec, manifest, path, len(path.exports) - 1)
                out[(model, exporter)] = Artifact(spec, entry) if "error" not in entry else entry["error"]
    return out


def _artifact(artifacts, model, exporter) -> Artifact:
    found = artifacts[(model, exporter)]
    if isinstance(found, str):
        pytest.skip(found)
    return found


# --------------------------------------------------------------------------- real exports


@pytest.mark.parametrize("exporter", list(PATH_OF))
@pytest.mark.parametrize("model", MODELS)
def test_every_tap_found_and_matches_golden(artifacts, model, exporter):
    art = _artifact(artifacts, model, exporter)
    candidates = art.candidates()
    mapping = art.map(exporter)
    assert list(mapping) == list(art.spec.taps)
    fused = FUSED.get((model, exporter), {})
    identity = IDENTITY.get(model, {})
    for tap, loc in mapping.items():
        keys = {"tensor", "how", "fused_into", "layout", "reason"}
        assert keys <= set(loc) <= keys | {"order", "unproven"}  # an axis order proven, or one left to values
        if tap in fused:
            assert (loc["how"], loc["fused_into"], loc["tensor"]) == ("fused", fused[tap], None), (tap, loc)
            assert loc["reason"]
            continue
        assert loc["how"] == HOW[exporter], (tap, loc)
        assert loc["tensor"] in candidates
        if tap in identity:
            assert loc["tensor"] == mapping[identity[tap]]["tensor"]
            assert "identity" in loc["reason"] and identity[tap] in loc["reason"]
    # the mapped tensors, in one fresh ORT run, match the golden taps (fp32 against fp64)
    mapped = {tap: loc for tap, loc in mapping.items() if loc["tensor"] is not None}
    values = og.run_tensors("ort", art.model, art.feed, [loc["tensor"] for loc in mapped.values()])
    for tap, loc in mapped.items():
        assert loc["layout"] in ("nchw", "nhwc", art.spec.model_inputs[0].layout)
        canonical = ot.to_canonical(values[loc["tensor"]], loc, art.golden[tap].shape)
        assert canonical.shape == art.golden[tap].shape
        worst = float(np.max(np.abs(canonical - art.golden[tap])))
        assert worst <= 1e-4, (tap, loc, worst)


def test_tf2onnx_cnn_layouts(artifacts):
    """tf2onnx's transpose optimiser leaves the conv activations in NCHW; 8x8x8 maps are a layout
    tie (NCHW shape == NHWC shape), settled by value, or by the neighbours when there are none."""
    art = _artifact(artifacts, "cnn", "tf2onnx")
    for values in (None, {}):
        mapping = art.map("tf2onnx", values=values)
        for tap in ("conv1", "bn1", "relu1", "pool1", "conv2", "bn2", "relu2"):
            assert mapping[tap]["layout"] == "nchw", (tap, mapping[tap])
        assert "tie" in mapping["conv1"]["reason"]
        assert mapping["pool1"]["reason"] is None  # 8x4x4 vs 4x4x8: the shape decides


@pytest.mark.parametrize("exporter", ["torch.onnx", "tf2onnx"])
@pytest.mark.parametrize("model", MODELS)
def test_metadata_and_names_do_not_depend_on_values(artifacts, model, exporter):
    """A faulty path's values match nothing; metadata and names still find every tap."""
    art = _artifact(artifacts, model, exporter)
    clean = art.map(exporter)
    faulty = {name: 3.0 * v + 1.0 for name, v in art.values().items()}
    for values in ({}, faulty):
        mapping = art.map(exporter, values=values)
        assert {t: (m["tensor"], m["how"], m["fused_into"]) for t, m in mapping.items()} == {
            t: (m["tensor"], m["how"], m["fused_into"]) for t, m in clean.items()
        }


# --------------------------------------------------------------------------- robustness


def _copy(model):
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def test_torch_tap_without_metadata_falls_back_to_value(artifacts):
    art = _artifact(artifacts, "cnn", "torch.onnx")
    clean = art.map("torch.onnx")
    model = _copy(art.model)
    (relu,) = [n for n in model.graph.node if ot.torch_scope(n, ("relu1",)) == "relu1"]
    del relu.metadata_props[:]
    mapping = art.map("torch.onnx", model=model)
    assert mapping["relu1"]["how"] == "value" and mapping["relu1"]["tensor"] == clean["relu1"]["tensor"]
    assert mapping["relu1"]["reason"]
    for tap in art.spec.taps:
        if tap != "relu1":
            assert mapping[tap] == clean[tap], tap
    # without values the tap cannot be placed: unmapped with a reason, the others unchanged
    bare = art.map("torch.onnx", model=model, values={})
    assert bare["relu1"]["how"] == "unmapped" and bare["relu1"]["tensor"] is None and bare["relu1"]["reason"]
    assert all(bare[t]["tensor"] == clean[t]["tensor"] for t in art.spec.taps if t != "relu1")


def test_tf2onnx_renamed_layer_falls_back_to_value(artifacts):
    art = _artifact(artifacts, "transformer", "tf2onnx")
    clean = art.map("tf2onnx")
    model = _copy(art.model)
    renamed = 0
    for node in model.graph.node:
        if ot.keras_scope(node.name, art.spec.taps) == "block0_gelu":
            node.name = f"renamed_{renamed}"
            renamed += 1
    assert renamed
    mapping = art.map("tf2onnx", model=model)
    assert mapping["block0_gelu"]["how"] == "value"
    assert mapping["block0_gelu"]["tensor"] == clean["block0_gelu"]["tensor"]
    assert all(mapping[t] == clean[t] for t in art.spec.taps if t != "block0_gelu")


def test_value_tap_that_matches_nothing_is_unmapped(artifacts):
    art = _artifact(artifacts, "cnn", "jax2onnx")
    values = art.values()
    clean = art.map("jax2onnx", values=values)
    target = clean["relu1"]["tensor"]
    values = dict(values, **{target: np.random.default_rng(0).normal(size=values[target].shape).astype(np.float32)})
    mapping = art.map("jax2onnx", values=values)
    assert mapping["relu1"]["how"] == "unmapped" and mapping["relu1"]["tensor"] is None
    assert target in mapping["relu1"]["reason"] and "off by" in mapping["relu1"]["reason"]
    assert all(mapping[t]["tensor"] == clean[t]["tensor"] for t in art.spec.taps if t != "relu1")


@pytest.mark.parametrize("model, exporter", [("cnn", "tf2onnx"), ("transformer", "tf2onnx"), ("cnn", "torch.onnx")])
def test_graph_without_names_maps_by_value(artifacts, model, exporter):
    """A tf2onnx graph without Keras names (what jax2tf -> tf2onnx gives) or a torch graph without
    metadata: every tap by value, onto the same tensors; a folded conv is still reported fused."""
    art = _artifact(artifacts, model, exporter)
    clean = art.map(exporter)
    bare = _copy(art.model)
    for index, node in enumerate(bare.graph.node):
        node.name = f"n{index}"
        del node.metadata_props[:]
    mapping = art.map(exporter, model=bare)
    for tap, loc in clean.items():
        assert mapping[tap]["tensor"] == loc["tensor"], tap
        assert mapping[tap]["how"] == ("fused" if loc["how"] == "fused" else "value"), tap
        assert mapping[tap]["fused_into"] == loc["fused_into"]
        assert mapping[tap]["layout"] == loc["layout"]


# --------------------------------------------------------------------------- ORT vs onnx.reference


@pytest.mark.parametrize("exporter", list(PATH_OF))
def test_compare_runtimes_clean_export(artifacts, exporter):
    art = _artifact(artifacts, "cnn", exporter)
    result = og.compare_runtimes(art.model, art.feed, art.spec.tolerances["fp32"].default)
    assert [e["tensor"] for e in result["nodes"]] == og.intermediate_names(art.model)
    assert result["first_divergent"] is None
    assert all(e["tol_units"] <= 1.0 and e["max_abs"] >= 0.0 for e in result["nodes"])


# --------------------------------------------------------------------------- small cases, no export


def test_to_canonical():
    nchw = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    nhwc = np.transpose(nchw, (0, 2, 3, 1))
    np.testing.assert_array_equal(ot.to_canonical(nhwc, {"layout": "nhwc"}, nchw.shape), nchw)
    np.testing.assert_array_equal(ot.to_canonical(nchw, {"layout": "nchw"}, nchw.shape), nchw)
    flat = np.arange(24, dtype=np.float32).reshape(6, 4)  # a (batch*tokens, d) matmul
    assert ot.to_canonical(flat, {"layout": "tokens"}, (2, 3, 4)).shape == (2, 3, 4)
    with pytest.raises(ValueError) as error:
        ot.to_canonical(flat, {"layout": "tokens", "tensor": "t"}, (2, 3, 5))
    message = str(error.value)
    assert "\n" not in message and "'t'" in message and "(6, 4)" in message and "(2, 3, 5)" in message
    with pytest.raises(ValueError, match="cannot hold"):  # checked before any transpose
        ot.to_canonical(nhwc, {"layout": "nhwc"}, (2, 3, 4, 4))


def test_module_imports_no_framework():
    import subprocess
    import sys

    probe = (
        "import sys, parity.diagnose.graph.onnx_taps; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('onnx', 'onnxruntime', 'torch', 'tensorflow', 'jax')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


def test_scope_parsers():
    from onnx import helper

    node = helper.make_node("Relu", ["a"], ["b"])
    taps = ("conv1", "bn1", "block0_attn", "logits")
    assert ot.torch_scope(node, taps) is None
    entry = node.metadata_props.add()
    entry.key, entry.value = ot.TORCH_SCOPES_KEY, "['', 'block0_attn', 'block0_attn.query', 'linear_1']"
    assert ot.torch_scope(node, taps) == "block0_attn"
    assert ot.torch_module_paths(node) == ["block0_attn", "block0_attn.query"]  # the op's own name is no module
    assert ot.torch_scope(node, ("block0_attn.query", "block0_attn.key")) == "block0_attn.query"
    assert ot.torch_scope(node, ("block0",)) is None  # a name that only starts the same is not its holder
    assert ot.keras_scope("cnn_1/conv1_1/BiasAdd__7", taps) == "conv1"
    assert ot.keras_scope("transformer_1/block0_attn_1/query_1/Tensordot", taps) == "block0_attn"
    assert ot.keras_scope("cnn_1/logits_1/MatMul_Gemm__6", taps) == "logits"
    assert ot.keras_scope("node_Conv_0", taps) is None
    assert ot.keras_scope("cnn_1/conv10_1/BiasAdd", taps) is None


def test_an_onnx_sources_own_tensor_is_compared_in_the_golden_order_even_where_layouts_tie(tmp_path):
    """A tap of an ONNX source names the source's own tensor: its golden is that tensor, in that order, so a
    (2, 4, 4, 4) tensor after a Reshape (NCHW and NHWC shapes agree, no Transpose to follow) is neither guessed nor
    left unproven: a departing value is compared, not dropped as a possible misread."""
    from click.testing import CliRunner
    from onnx import TensorProto, helper, numpy_helper

    from parity.cli import cli
    from parity.diagnose.graph import mapping_check

    rng = np.random.default_rng(0)
    weights = rng.standard_normal((16, 64)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["fc"]),
            helper.make_node("Reshape", ["fc", "cube"], ["view"]),
            helper.make_node("Tanh", ["view"], ["act"]),
            helper.make_node("Reshape", ["act", "flat"], ["out"]),
        ],
        "cube",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 64])],
        [
            numpy_helper.from_array(weights, "w"),
            numpy_helper.from_array(np.array([2, 4, 4, 4], np.int64), "cube"),
            numpy_helper.from_array(np.array([2, 64], np.int64), "flat"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(tmp_path / "cube.onnx"))
    result = CliRunner().invoke(
        cli, ["init", "cube", "--workspace", str(tmp_path), "--onnx", str(tmp_path / "cube.onnx")]
    )
    assert result.exit_code == 0, result.output
    spec_file = tmp_path / "models" / "cube.py"
    spec_file.write_text(spec_file.read_text().replace("taps=(),", "taps=('view', 'act'),"))
    spec = Workspace(tmp_path).load_spec("cube")

    x = rng.standard_normal((2, 16))
    view = (x @ weights.astype(np.float64)).reshape(2, 4, 4, 4)
    golden_taps = {"view": view, "act": np.tanh(view)}
    departing = {tap: (value + 1.0).astype(np.float32) for tap, value in golden_taps.items()}
    for values in (departing, {}):  # settled by value, or with no values at all
        mapped = ot.map_taps(model, spec, "onnx file", golden_taps, values, "native")
        for tap, where in mapped.items():
            assert where["tensor"] == tap and not where.get("unproven") and not where.get("order"), where
            read = mapping_check.settle(
                departing[tap], where, golden_taps[tap], spec.output_tolerances("fp32").for_name(tap)
            )
            np.testing.assert_array_equal(read, departing[tap])  # compared as it is: a divergence, in place
