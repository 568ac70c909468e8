"""ONNX test-data folders and Polygraphy JSON: round trips, ordering, matching a graph, every refusal."""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import pickle

import numpy as np
import pytest

from parity.interop import onnx_test_data as interop
from parity.interop import polygraphy
from parity.interop.onnx_test_data import InteropError
from parity.platform.errors import ParityError

needs_onnx = pytest.mark.skipif(importlib.util.find_spec("onnx") is None, reason="needs onnx")

DTYPES = [np.float32, np.float64, np.int64, np.float16]


def _arrays(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"t_{np.dtype(d).name}": (rng.standard_normal((2, 3)) * 10).astype(d) for d in DTYPES}


def _assert_same(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for name, array in want.items():
        assert got[name].dtype == array.dtype and got[name].shape == array.shape, name
        np.testing.assert_array_equal(got[name], array)


def _tensor_file(path, array, name=""):
    from onnx import numpy_helper

    path.write_bytes(numpy_helper.from_array(array, name).SerializeToString())


# ---------------------------------------------------------------- ONNX test-data folders


@needs_onnx
def test_test_data_round_trip_keeps_names_order_and_dtypes(tmp_path):
    inputs, outputs = _arrays(0), {"y": np.arange(4, dtype=np.int64), "z": np.ones((1,), np.float16)}
    written = interop.write_test_data(tmp_path / "model", inputs, outputs)
    assert written == tmp_path / "model" / "test_data_set_0"
    assert sorted(p.name for p in written.iterdir()) == [
        "input_0.pb",
        "input_1.pb",
        "input_2.pb",
        "input_3.pb",
        "output_0.pb",
        "output_1.pb",
    ]
    [data_set] = interop.read_test_data(tmp_path / "model")
    assert isinstance(data_set, interop.TestDataSet) and data_set.path == written
    _assert_same(data_set.inputs, inputs)
    _assert_same(data_set.outputs, outputs)
    assert [p.name for p in (tmp_path / "model").iterdir()] == ["test_data_set_0"]  # no scratch left


@needs_onnx
def test_sets_and_tensors_are_ordered_numerically(tmp_path):
    many = {f"in{i}": np.full((1,), i, np.float32) for i in range(12)}
    for index in reversed(range(12)):
        interop.write_test_data(tmp_path, {"x": np.full((2,), index, np.int64)} | many, {}, index=index)
    sets = interop.read_test_data(tmp_path)
    assert [s.path.name for s in sets] == [f"test_data_set_{i}" for i in range(12)]
    assert [int(s.inputs["x"][0]) for s in sets] == list(range(12))
    assert list(sets[11].inputs) == ["x"] + [f"in{i}" for i in range(12)]  # input_10.pb after input_9.pb
    assert [float(a[0]) for a in list(sets[11].inputs.values())[1:]] == list(range(12))


@needs_onnx
def test_unnamed_tensors_get_positional_names(tmp_path):
    folder = tmp_path / "test_data_set_0"
    folder.mkdir()
    for i in range(11):
        _tensor_file(folder / f"input_{i}.pb", np.full((1,), i, np.int64))
    _tensor_file(folder / "output_0.pb", np.zeros(2, np.float32))
    [data_set] = interop.read_test_data(tmp_path)
    assert list(data_set.inputs) == [f"input_{i}" for i in range(11)]
    assert [int(a[0]) for a in data_set.inputs.values()] == list(range(11))
    assert list(data_set.outputs) == ["output_0"]


@needs_onnx
def test_writing_a_set_again_replaces_it_whole(tmp_path):
    interop.write_test_data(tmp_path, {"a": np.zeros(1), "b": np.zeros(1)}, {"y": np.zeros(1)})
    interop.write_test_data(tmp_path, {"a": np.ones(3, np.float32)}, {})
    [data_set] = interop.read_test_data(tmp_path)
    assert sorted(p.name for p in data_set.path.iterdir()) == ["input_0.pb"]
    _assert_same(data_set.inputs, {"a": np.ones(3, np.float32)})
    assert data_set.outputs == {}
    assert [p.name for p in tmp_path.iterdir()] == ["test_data_set_0"]


@needs_onnx
def test_writing_refuses_what_onnx_cannot_hold(tmp_path):
    with pytest.raises(InteropError, match="at least one input"):
        interop.write_test_data(tmp_path, {}, {"y": np.zeros(1)})
    with pytest.raises(InteropError, match="'x' cannot be stored as an ONNX tensor"):
        interop.write_test_data(tmp_path, {"x": np.array([object()], dtype=object)}, {})
    assert list(tmp_path.iterdir()) == []  # the failed set left nothing behind


@needs_onnx
def test_test_data_errors_name_the_folder_or_file(tmp_path):
    assert issubclass(InteropError, ParityError)
    with pytest.raises(InteropError, match="no test_data_set_"):
        interop.read_test_data(tmp_path)
    with pytest.raises(InteropError, match="not a folder"):
        interop.read_test_data(tmp_path / "missing")

    only_outputs = tmp_path / "a" / "test_data_set_0"
    only_outputs.mkdir(parents=True)
    with pytest.raises(InteropError, match=r"test_data_set_0: no input_\*\.pb or output_\*\.pb files"):
        interop.read_test_data(tmp_path / "a")
    _tensor_file(only_outputs / "output_0.pb", np.zeros(1, np.float32))
    sets = interop.read_test_data(tmp_path / "a")  # outputs alone: the data of a graph that takes no input
    with pytest.raises(InteropError, match=r"test_data_set_0: 0 input files, the graph has 1 inputs"):
        interop.match_graph(sets, {"x": ((1,), "float32")})

    gap = tmp_path / "b" / "test_data_set_0"
    gap.mkdir(parents=True)
    _tensor_file(gap / "input_0.pb", np.zeros(1, np.float32), "x")
    _tensor_file(gap / "input_2.pb", np.zeros(1, np.float32), "z")
    with pytest.raises(InteropError, match=r"input files are numbered \[0, 2\]"):
        interop.read_test_data(tmp_path / "b")

    for name, payload in {"c": b"\xff\xff\xff not protobuf", "d": b""}.items():
        bad = tmp_path / name / "test_data_set_3"
        bad.mkdir(parents=True)
        _tensor_file(bad / "input_0.pb", np.zeros(1, np.float32))
        (bad / "input_1.pb").write_bytes(payload)
        with pytest.raises(InteropError) as caught:
            interop.read_test_data(tmp_path / name)
        message = str(caught.value)
        assert "test_data_set_3/input_1.pb: not a serialized onnx.TensorProto" in message and "\n" not in message

    twice = tmp_path / "e" / "test_data_set_0"
    twice.mkdir(parents=True)
    _tensor_file(twice / "input_0.pb", np.zeros(1, np.float32), "x")
    _tensor_file(twice / "input_1.pb", np.zeros(1, np.float32), "x")
    with pytest.raises(InteropError, match="input_1.pb: a second input named 'x'"):
        interop.read_test_data(tmp_path / "e")


def _model(old_style: bool = False):
    """x (N, 3) float32 and ids (2,) int64 -> y = x @ w + b, n = ids * 2; w, b initializers."""
    from onnx import TensorProto, checker, helper, numpy_helper

    w = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(3, 2), "w")
    b = numpy_helper.from_array(np.ones(2, np.float32), "b")
    two = numpy_helper.from_array(np.array(2, np.int64), "two")
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3]),
        helper.make_tensor_value_info("ids", TensorProto.INT64, [2]),
    ]
    if old_style:  # IR 3 models list every initializer among the graph inputs
        inputs += [helper.make_tensor_value_info(t.name, t.data_type, t.dims) for t in (w, b, two)]
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["y"]),
            helper.make_node("Mul", ["ids", "two"], ["n"]),
        ],
        "g",
        inputs,
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2]),
            helper.make_tensor_value_info("n", TensorProto.INT64, [2]),
        ],
        initializer=[w, b, two],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    checker.check_model(model)
    return model


@needs_onnx
@pytest.mark.parametrize("old_style", [False, True])
def test_graph_signature_skips_initializers(old_style):
    inputs, outputs = interop.graph_signature(_model(old_style))
    assert inputs == {"x": (("N", 3), "float32"), "ids": ((2,), "int64")}
    assert outputs == ["y", "n"]


@needs_onnx
def test_graph_signature_unknown_dims_and_rank():
    from onnx import TensorProto, helper

    unknown = helper.make_tensor_value_info("u", TensorProto.FLOAT16, None)
    partial = helper.make_tensor_value_info("p", TensorProto.DOUBLE, [None, 4])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["p"], ["q"])],
        "g",
        [unknown, partial],
        [helper.make_tensor_value_info("q", TensorProto.DOUBLE, [None, 4])],
    )
    inputs, outputs = interop.graph_signature(helper.make_model(graph))
    assert inputs == {"u": (None, "float16"), "p": ((None, 4), "float64")} and outputs == ["q"]


@needs_onnx
def test_match_graph_rekeys_by_name_or_position_and_feeds_onnxruntime(tmp_path):
    model = _model()
    x, ids = np.arange(15, dtype=np.float32).reshape(5, 3), np.array([4, 7], np.int64)
    y = x @ np.arange(6, dtype=np.float32).reshape(3, 2) + 1
    interop.write_test_data(tmp_path, {"ids": ids, "x": x}, {"n": ids * 2, "y": y}, index=0)  # named, other order
    set_1 = tmp_path / "test_data_set_1"
    set_1.mkdir()
    _tensor_file(set_1 / "input_0.pb", x[:1])  # unnamed: by position
    _tensor_file(set_1 / "input_1.pb", ids)
    _tensor_file(set_1 / "output_0.pb", y[:1])
    _tensor_file(set_1 / "output_1.pb", ids * 2)
    inputs, outputs = interop.graph_signature(model)
    feeds, references = interop.match_graph(interop.read_test_data(tmp_path), inputs, outputs)
    assert [list(f) for f in feeds] == [["x", "ids"], ["x", "ids"]]
    assert [list(r) for r in references] == [["y", "n"], ["y", "n"]]
    np.testing.assert_array_equal(feeds[1]["x"], x[:1])

    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for feed, reference in zip(feeds, references):
        got = dict(zip(outputs, session.run(outputs, feed)))
        for name in outputs:
            np.testing.assert_allclose(got[name], reference[name], rtol=1e-6)

    _, as_read = interop.match_graph(interop.read_test_data(tmp_path), inputs)
    assert list(as_read[0]) == ["n", "y"] and list(as_read[1]) == ["output_0", "output_1"]


def _one_set(tmp_path, inputs, outputs=None):
    interop.write_test_data(tmp_path, inputs, outputs or {})
    return interop.read_test_data(tmp_path)


@needs_onnx
def test_match_graph_refusals_name_the_file(tmp_path):
    inputs, outputs = interop.graph_signature(_model())
    ids = np.zeros(2, np.int64)
    cases = [
        (
            {"x": np.zeros((1, 4), np.float32), "ids": ids},
            "test_data_set_0/input_0.pb: input 'x' has shape (1, 4), model.onnx takes (N, 3)",
        ),
        ({"x": np.zeros((1, 3, 1), np.float32), "ids": ids}, "input 'x' has shape (1, 3, 1)"),
        (
            {"x": np.zeros((1, 3), np.float32), "ids": np.zeros(3, np.int64)},
            "test_data_set_0/input_1.pb: input 'ids' has shape (3), model.onnx takes (2)",
        ),
        (
            {"x": np.zeros((1, 3), np.float64), "ids": ids},
            "input_0.pb: input 'x' has dtype float64, model.onnx takes float32",
        ),
        ({"x": np.zeros((1, 3), np.float32)}, "test_data_set_0: 1 input files, model.onnx has 2 inputs"),
        ({"x": np.zeros((1, 3), np.float32), "idz": ids}, "input_1.pb: input 'idz' is not an input of model.onnx"),
    ]
    for feed, message in cases:
        with pytest.raises(InteropError) as caught:
            interop.match_graph(_one_set(tmp_path, feed), inputs, source="model.onnx")
        assert message in str(caught.value)

    mixed = tmp_path / "mixed"
    mixed.mkdir()
    set_0 = mixed / "test_data_set_0"
    set_0.mkdir()
    _tensor_file(set_0 / "input_0.pb", ids, "ids")
    _tensor_file(set_0 / "input_1.pb", np.zeros((1, 3), np.float32))
    with pytest.raises(InteropError, match="input 'ids' is number 0, the graph has it as number 1"):
        interop.match_graph(interop.read_test_data(mixed), inputs)

    good = {"x": np.zeros((7, 3), np.float32), "ids": ids}  # N is dynamic: 7 matches
    feeds, _ = interop.match_graph(_one_set(tmp_path, good), inputs)
    assert feeds[0]["x"].shape == (7, 3)
    with pytest.raises(InteropError, match="1 output files, the graph has 2 outputs"):
        interop.match_graph(_one_set(tmp_path, good, {"y": np.zeros((7, 2), np.float32)}), inputs, outputs)


# ---------------------------------------------------------------- Polygraphy JSON

# Written by Polygraphy 0.53.6 (RunResults.save with two runners; save_json([feed]) as --save-inputs does):
# each array is base64 of np.save bytes.
NPY_Y = "k05VTVBZAQB2AHsnZGVzY3InOiAnPGY0JywgJ2ZvcnRyYW5fb3JkZXInOiBGYWxzZSwgJ3NoYXBlJzogKDIsKSwgfSAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgIAoAAAA/AACAvw=="
NPY_N = "k05VTVBZAQB2AHsnZGVzY3InOiAnPGk4JywgJ2ZvcnRyYW5fb3JkZXInOiBGYWxzZSwgJ3NoYXBlJzogKDEsKSwgfSAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgIAoDAAAAAAAAAA=="
NPY_H = "k05VTVBZAQB2AHsnZGVzY3InOiAnPGYyJywgJ2ZvcnRyYW5fb3JkZXInOiBGYWxzZSwgJ3NoYXBlJzogKDEsKSwgfSAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgIAoANA=="
NPY_X = "k05VTVBZAQB2AHsnZGVzY3InOiAnPGY4JywgJ2ZvcnRyYW5fb3JkZXInOiBGYWxzZSwgJ3NoYXBlJzogKDEsIDIpLCB9ICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgIAoAAAAAAAD4PwAAAAAAAABA"


def _pg_array(npy):
    return {"values": {"array": npy, "polygraphy_class": "ndarray"}, "polygraphy_class": "LazyArray"}


def _pg_iteration(runner, outputs):
    return {"outputs": outputs, "runtime": None, "runner_name": runner, "polygraphy_class": "IterationResult"}


POLYGRAPHY_OUTPUTS = {
    "lst": [
        ["trt-runner", [_pg_iteration("trt-runner", {"y": _pg_array(NPY_Y), "n": _pg_array(NPY_N)})]],
        ["onnxrt-runner", [_pg_iteration("onnxrt-runner", {"y": _pg_array(NPY_H)})]],
    ],
    "polygraphy_class": "RunResults",
}
POLYGRAPHY_INPUTS = [{"x": {"array": NPY_X, "polygraphy_class": "ndarray"}}]
LEGACY = "polygraphy_serialized_json_type"


def _write_json(path, data):
    path.write_text(json.dumps(data))
    return path


class Unpickled(BaseException):
    """Raised by the patched ``pickle.load(s)``; a BaseException, so no ``except Exception`` hides it."""


@pytest.fixture
def no_unpickling(monkeypatch):
    """Any unpickling at all fails the test (NumPy unpickles through ``pickle.load``)."""

    def refuse(*args, **kwargs):
        raise Unpickled("parity unpickled something")

    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)


def test_reads_files_written_by_polygraphy(tmp_path, no_unpickling):
    path = _write_json(tmp_path / "outputs.json", POLYGRAPHY_OUTPUTS)
    [trt] = polygraphy.read_outputs(path, runner="trt-runner")
    _assert_same(trt, {"y": np.array([0.5, -1.0], np.float32), "n": np.array([3], np.int64)})
    [ort] = polygraphy.read_outputs(path, runner="onnxrt-runner")
    _assert_same(ort, {"y": np.array([0.25], np.float16)})
    [feed] = polygraphy.read_inputs(_write_json(tmp_path / "inputs.json", POLYGRAPHY_INPUTS))
    _assert_same(feed, {"x": np.array([[1.5, 2.0]], np.float64)})


def test_writes_exactly_what_polygraphy_writes(tmp_path):
    trt = {"y": np.array([0.5, -1.0], np.float32), "n": np.array([3], np.int64)}
    polygraphy.write_run_results(tmp_path / "o.json", "trt-runner", [trt])
    expected = {"lst": POLYGRAPHY_OUTPUTS["lst"][:1], "polygraphy_class": "RunResults"}
    assert (tmp_path / "o.json").read_text() == json.dumps(expected, indent=4)
    polygraphy.write_inputs(tmp_path / "i.json", [{"x": np.array([[1.5, 2.0]], np.float64)}])
    assert (tmp_path / "i.json").read_text() == json.dumps(POLYGRAPHY_INPUTS, indent=4)


def test_polygraphy_round_trip_many_iterations_and_names(tmp_path, no_unpickling):
    iterations = [_arrays(seed) | {f"o{i}": np.full((1,), i, np.int64) for i in range(12)} for seed in range(11)]
    polygraphy.write_run_results(tmp_path / "outputs.json", "onnxrt-runner", iterations)
    got = polygraphy.read_outputs(tmp_path / "outputs.json")
    assert len(got) == 11
    for have, want in zip(got, iterations):
        _assert_same(have, want)
    polygraphy.write_inputs(tmp_path / "inputs.json", iterations)
    for have, want in zip(polygraphy.read_inputs(tmp_path / "inputs.json"), iterations, strict=True):
        _assert_same(have, want)
    _write_json(tmp_path / "single.json", POLYGRAPHY_INPUTS[0])  # one bare feed dict, as Polygraphy accepts
    assert list(polygraphy.read_inputs(tmp_path / "single.json")[0]) == ["x"]


def _legacy(cls: str, **fields):
    return fields | {f"__polygraphy_encoded_{cls}": LEGACY}


def test_reads_the_legacy_layout_of_polygraphy_0_27_to_0_29(tmp_path, no_unpickling):
    """Legacy type tags, LazyNumpyArray, and arrays as the latin-1 text of np.savez bytes."""
    array = np.arange(5, dtype=np.float16)
    buffer = io.BytesIO()
    np.savez(buffer, array)
    encoded = _legacy("ndarray", array=buffer.getvalue().decode("latin-1"))
    iteration = _legacy(
        "IterationResult",
        outputs={"y": _legacy("LazyNumpyArray", values=encoded)},
        runtime=0.1,
        runner_name="trt-runner",
    )
    path = _write_json(tmp_path / "old.json", _legacy("RunResults", lst=[["trt-runner", [iteration]]]))
    [outputs] = polygraphy.read_outputs(path)
    _assert_same(outputs, {"y": array})
    [feed] = polygraphy.read_inputs(_write_json(tmp_path / "old_in.json", [{"x": encoded}]))
    _assert_same(feed, {"x": array})


def _npy(array, **kwargs) -> str:
    buffer = io.BytesIO()
    np.save(buffer, array, **kwargs)
    return base64.b64encode(buffer.getvalue()).decode()


def test_pickled_data_is_refused_and_never_unpickled(tmp_path, no_unpickling):
    pickled = base64.b64encode(pickle.dumps(np.zeros(3))).decode()
    object_npy = _npy(np.array([1, None], dtype=object), allow_pickle=True)
    payloads = {
        "old-layout pickle": ([{"x": _legacy("ndarray", array=pickled)}], "the array is a pickle"),
        "current-layout pickle": ([{"x": {"array": pickled, "polygraphy_class": "ndarray"}}], "the array is a pickle"),
        "object .npy": ([{"x": {"array": object_npy, "polygraphy_class": "ndarray"}}], "an object array"),
        "torch tensor": ([{"x": {"tensor": pickled, "polygraphy_class": "Tensor"}}], "a torch.Tensor"),
    }
    for what, (data, reason) in payloads.items():
        path = _write_json(tmp_path / "inputs.json", data)
        with pytest.raises(InteropError) as caught:
            polygraphy.read_inputs(path)
        message = str(caught.value)
        assert message.startswith(f"{path}: iteration 0, 'x': {reason}"), what
        assert "parity never unpickles" in message and "np.save" in message and "\n" not in message, what

    whole = tmp_path / "results.pkl"
    whole.write_bytes(pickle.dumps([{"x": np.zeros(3)}]))
    for read in (polygraphy.read_inputs, polygraphy.read_outputs):
        with pytest.raises(InteropError, match="a pickle file .* parity never unpickles"):
            read(whole)


def test_polygraphy_file_refusals(tmp_path):
    outputs = _write_json(tmp_path / "outputs.json", POLYGRAPHY_OUTPUTS)
    inputs = _write_json(tmp_path / "inputs.json", POLYGRAPHY_INPUTS)
    with pytest.raises(InteropError, match=r"holds 2 runners \['trt-runner', 'onnxrt-runner'\]; say which one"):
        polygraphy.read_outputs(outputs)
    with pytest.raises(InteropError, match=r"no runner 'tf-runner'; it holds \['trt-runner', 'onnxrt-runner'\]"):
        polygraphy.read_outputs(outputs, runner="tf-runner")
    with pytest.raises(InteropError, match="not a Polygraphy RunResults file"):
        polygraphy.read_outputs(inputs)
    with pytest.raises(InteropError, match=r"holds Polygraphy RunResults \(--save-outputs\), not inputs"):
        polygraphy.read_inputs(outputs)

    text = tmp_path / "notes.json"
    text.write_text("{not json")
    broken = {
        "lst": [
            [
                "r",
                [
                    {
                        "outputs": {"y": {"polygraphy_class": "ndarray"}},
                        "runtime": None,
                        "runner_name": "r",
                        "polygraphy_class": "IterationResult",
                    }
                ],
            ]
        ],
        "polygraphy_class": "RunResults",
    }
    truncated = _npy(np.arange(100, dtype=np.float64))[:200]
    cases = [
        (polygraphy.read_inputs, text, "notes.json: not a JSON file"),
        (polygraphy.read_inputs, tmp_path / "absent.json", "absent.json: cannot be read"),
        (polygraphy.read_inputs, _write_json(tmp_path / "e.json", []), "not a Polygraphy input file"),
        (polygraphy.read_inputs, _write_json(tmp_path / "n.json", 3), "not a Polygraphy input file"),
        (polygraphy.read_inputs, _write_json(tmp_path / "d.json", [{}]), "iteration 0: expected a non-empty"),
        (
            polygraphy.read_inputs,
            _write_json(tmp_path / "g.json", [{"x": {"array": "aGVsbG8=", "polygraphy_class": "ndarray"}}]),
            "'x': the array is neither .npy nor .npz data",
        ),
        (
            polygraphy.read_inputs,
            _write_json(tmp_path / "t.json", [{"x": {"array": truncated, "polygraphy_class": "ndarray"}}]),
            "'x': corrupt array data",
        ),
        (
            polygraphy.read_inputs,
            _write_json(tmp_path / "l.json", [{"x": [1, 2]}]),
            "'x': not a Polygraphy-encoded array",
        ),
        (
            polygraphy.read_outputs,
            _write_json(tmp_path / "b.json", broken),
            "runner 'r', iteration 0, 'y': not a Polygraphy-encoded array",
        ),
        (
            polygraphy.read_outputs,
            _write_json(tmp_path / "z.json", {"lst": [["r", []]], "polygraphy_class": "RunResults"}),
            "runner 'r' has no iterations",
        ),
        (
            polygraphy.read_outputs,
            _write_json(tmp_path / "s.json", {"lst": [["r", [{"y": 1}]]], "polygraphy_class": "RunResults"}),
            "iteration 0: not a Polygraphy IterationResult",
        ),
    ]
    for read, path, message in cases:
        with pytest.raises(InteropError) as caught:
            read(path)
        assert message in str(caught.value) and str(path) in str(caught.value) and "\n" not in str(caught.value)

    with pytest.raises(InteropError, match="cannot be saved without pickling"):
        polygraphy.write_inputs(tmp_path / "w.json", [{"x": np.array([None], dtype=object)}])
    assert not (tmp_path / "w.json").exists()
