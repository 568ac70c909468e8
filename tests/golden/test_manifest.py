"""Golden data is verified before use: manifest digest and schema, arrays against the manifest and the spec.

The fuzz tests mutate the manifest and the golden arrays of a workspace copy and run the real
CLI: every mutation that changes what parity reads must end in one line and exit 2, never a
traceback and never a silent exit 0.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parity.cli import cli
from parity.golden import store as golden
from parity.model import manifest
from parity.platform.errors import GoldenError
from tests.conftest import REPO, reseal

FUZZ = settings(
    max_examples=int(os.environ.get("PARITY_FUZZ_EXAMPLES", "300")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


def invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture
def mlp_golden(workspace_copy):
    root = workspace_copy()
    return root, root / "golden" / "mlp"


def assert_one_line_exit_2(result, *needles):
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    # golden verify says FAILED; a check reports the model's error and goes on with the other models
    failed = [
        line
        for line in result.output.splitlines()
        if "FAILED" in line or line.startswith("error:") or ": ERROR " in line
    ]
    assert failed, result.output
    for needle in needles:
        assert needle in result.output, (needle, result.output)


def test_builtin_manifests_are_sealed_and_valid():
    for model in ("mlp", "cnn", "transformer"):
        data = manifest.read(REPO / "golden" / model / "manifest.json")
        assert data["digest"] == manifest.canonical_digest(data)


def test_shipped_schema_is_a_valid_draft_2020_12_schema():
    """The schema ships with the package and is not re-checked at run time: it must pass its metaschema here."""
    import jsonschema

    schema = manifest.schema_document()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)
    assert jsonschema.validators.validator_for(schema) is jsonschema.Draft202012Validator


def test_manifest_changed_after_a_read_is_checked_again(mlp_golden):
    """A manifest read once is not trusted afterwards: an edit in place that keeps the size and the modification
    time, with a valid digest, is schema-checked again at the next read."""
    _, golden_dir = mlp_golden
    path = golden_dir / "manifest.json"
    before = manifest.read(path)
    original, stat = path.read_bytes(), path.stat()
    edited = json.loads(original)
    edited["files"]["weights.npz"]["sha256"] = "x" * 64  # not hex: a schema violation of the same length
    edited = manifest.seal(edited)
    data = original.replace(before["files"]["weights.npz"]["sha256"].encode(), b"x" * 64).replace(
        before["digest"].encode(), edited["digest"].encode()
    )
    assert len(data) == len(original) and json.loads(data) == edited
    path.write_bytes(data)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    with pytest.raises(GoldenError, match=r"invalid manifest field files\.weights\.npz\.sha256"):
        manifest.read(path)
    with pytest.raises(GoldenError, match=r"invalid manifest field files\.weights\.npz\.sha256"):
        manifest.read(path)  # a refused manifest is refused again, every time
    path.write_bytes(original)
    assert manifest.read(path) == before


@pytest.mark.parametrize("value", [0.0, 2.0, 0.9733])
def test_edited_golden_metric_is_refused_by_check(mlp_golden, value):
    """accuracy 0.0 once made every path pass the metric rule; 2.0 failed every path."""
    root, golden_dir = mlp_golden
    path = golden_dir / "manifest.json"
    data = json.loads(path.read_text())
    data["metrics"]["accuracy"] = value
    path.write_text(json.dumps(data, indent=2))
    result = invoke("check", "--workspace", str(root), "--path", "torch")
    assert_one_line_exit_2(result, "manifest.json")
    assert "manifest digest mismatch" in result.output or "invalid manifest field metrics.accuracy" in result.output


def test_resealed_wrong_metric_is_refused(mlp_golden):
    """Even with a valid digest, golden metrics must be what the verified eval logits give."""
    _, golden_dir = mlp_golden
    reseal(golden_dir, edit=lambda m: m["metrics"].update(accuracy=0.5))
    with pytest.raises(GoldenError, match="golden metric accuracy is 0.5, but the verified eval logits give"):
        golden.verify(golden_dir)


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda m: m.pop("versions"), "versions"),
        (lambda m: m.update(metrics="high"), "metrics"),
        (lambda m: m["files"]["weights.npz"].update(sha256=42), "files.weights.npz.sha256"),
        (lambda m: m["tolerances"]["fp32"]["default"].update(atol=-1.0), "tolerances.fp32.default.atol"),
        (lambda m: m["files"]["inputs.npz"]["arrays"]["x"].update(shape=[[[[]]]]), "files.inputs.npz.arrays.x.shape"),
    ],
)
def test_schema_violation_names_the_field(mlp_golden, edit, field):
    _, golden_dir = mlp_golden
    reseal(golden_dir, edit=edit)
    with pytest.raises(GoldenError, match="invalid manifest field") as caught:
        golden.verify(golden_dir)
    assert field in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "content, needle",
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"schema": "parity.golden/2", "x": "\xff\xfe"}', "not UTF-8"),
        (b'{"schema": "parity.golden/2", "metrics": 1e999}', "out of range"),
        (b'{"schema": "parity.golden/2", "metrics": NaN}', "NaN is not a JSON number"),
        (b'{"schema": "parity.golden/2", "n": 1' + b"0" * 5000 + b"}", "malformed manifest"),
        (b"[1, 2]", "a JSON object expected"),
        (json.dumps({"schema": "parity.golden/1"}).encode(), "this parity reads 'parity.golden/3'"),
    ],
)
def test_malformed_manifest_is_one_line(mlp_golden, content, needle):
    root, golden_dir = mlp_golden
    (golden_dir / "manifest.json").write_bytes(content)
    result = invoke("golden", "verify", "--workspace", str(root))
    assert_one_line_exit_2(result, needle, "manifest.json")


def _paths(value, prefix=()):
    """Every location in a JSON tree, as key/index tuples."""
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _paths(child, (*prefix, index))


REPLACEMENTS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, 2.0, -1.0, 1e308, 1e-308]),
    st.text(max_size=20),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
    st.integers(min_value=1, max_value=5000).map(lambda depth: f"{DEEP}{depth}"),
)
DEEP = "@nested-lists@"  # stands for that many nested lists, spliced into the text (json.dumps would recurse)


def _mutate(original: dict, data) -> bytes:
    """One mutation: edit a value, delete a key, or damage the bytes."""
    kind = data.draw(st.sampled_from(["replace", "delete", "tweak", "bytes"]))
    text = json.dumps(original, indent=2).encode()
    if kind == "bytes":
        position = data.draw(st.integers(0, len(text)))
        action = data.draw(st.sampled_from(["truncate", "insert", "non-utf8"]))
        if action == "truncate":
            return text[:position]
        insert = b"\xff\xc3(" if action == "non-utf8" else data.draw(st.binary(min_size=1, max_size=8))
        return text[:position] + insert + text[position:]
    mutated = json.loads(json.dumps(original))
    locations = [p for p in _paths(mutated) if p]
    location = data.draw(st.sampled_from(locations))
    parent = mutated
    for step in location[:-1]:
        parent = parent[step]
    if kind == "delete":
        del parent[location[-1]]
    elif (
        kind == "tweak"
        and isinstance(parent[location[-1]], (int, float))
        and not isinstance(parent[location[-1]], bool)
    ):
        parent[location[-1]] = parent[location[-1]] * data.draw(st.sampled_from([0, -1, 2, 1 + 1e-12]))
    else:
        parent[location[-1]] = data.draw(REPLACEMENTS)
    text = json.dumps(mutated, indent=data.draw(st.sampled_from([None, 2])))
    return re.sub(f'"{DEEP}(\\d+)"', lambda m: "[" * int(m[1]) + "]" * int(m[1]), text).encode()


def _canonical(content: bytes):
    try:
        value = json.loads(content.decode("utf-8"))
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (ValueError, RecursionError):
        return None


@FUZZ
@given(data=st.data())
def test_fuzzed_manifest_never_tracebacks_and_never_passes_silently(mlp_golden, data):
    root, golden_dir = mlp_golden
    path = golden_dir / "manifest.json"
    pristine = path.read_bytes()
    original = json.loads(pristine)
    content = _mutate(original, data)
    path.write_bytes(content)
    try:
        result = invoke("golden", "verify", "--workspace", str(root))
    finally:
        path.write_bytes(pristine)
    unchanged = _canonical(content) == _canonical(pristine)
    if unchanged:
        assert result.exit_code == 0, result.output
    else:
        assert_one_line_exit_2(result, "manifest.json")


GOLDEN_FILES = st.sampled_from(golden.FILES)


@FUZZ
@given(data=st.data())
def test_fuzzed_golden_arrays_are_refused_naming_the_file(mlp_golden, data):
    """Byte damage is caught by the checksums; consistent rewrites (resealed) by the array checks."""
    root, golden_dir = mlp_golden
    name = data.draw(GOLDEN_FILES)
    backup = golden_dir.parent / "backup"
    shutil.copytree(golden_dir, backup)
    try:
        arrays = golden.load_arrays(golden_dir, name)
        key = data.draw(st.sampled_from(sorted(arrays)))
        kind = data.draw(st.sampled_from(["truncate", "flip", "append", "nan", "reshape", "retype", "drop", "rename"]))
        raw = (golden_dir / name).read_bytes()
        if kind == "truncate":
            (golden_dir / name).write_bytes(raw[: data.draw(st.integers(0, len(raw) - 1))])
        elif kind == "flip":
            position = data.draw(st.integers(0, len(raw) - 1))
            (golden_dir / name).write_bytes(raw[:position] + bytes([raw[position] ^ 0x10]) + raw[position + 1 :])
        elif kind == "append":
            (golden_dir / name).write_bytes(raw + data.draw(st.binary(min_size=1, max_size=16)))
        else:
            value = arrays[key]
            if kind == "nan" and value.dtype.kind == "f":
                value = value.copy()
                value.flat[data.draw(st.integers(0, value.size - 1))] = data.draw(
                    st.sampled_from([np.nan, np.inf, -np.inf])
                )
            elif kind == "reshape" or (kind == "nan" and value.dtype.kind != "f"):
                value = value.reshape(-1)[: max(value.size - 1, 0)]
            elif kind == "retype":
                value = value.astype(np.float32 if value.dtype != np.float32 else np.float64)
            if kind == "drop":
                arrays.pop(key)
            elif kind == "rename":
                arrays[key + "_renamed"] = arrays.pop(key)
            else:
                arrays[key] = value
            reseal(golden_dir, name, arrays)
        result = invoke("golden", "verify", "--workspace", str(root))
    finally:
        shutil.rmtree(golden_dir)
        backup.rename(golden_dir)
    assert_one_line_exit_2(result, name)


def test_nan_in_golden_inputs_names_the_file_and_array(mlp_golden):
    """It once failed every path ("10 of 640 elements are NaN") instead of naming the golden file."""
    root, golden_dir = mlp_golden
    arrays = golden.load_arrays(golden_dir, "inputs.npz")
    arrays["x"][0, :10] = np.nan
    reseal(golden_dir, "inputs.npz", arrays)
    result = invoke("check", "--workspace", str(root), "--path", "torch")
    assert_one_line_exit_2(result, "inputs.npz", "array 'x' (input) has 10 NaN")


def test_golden_that_no_longer_fits_the_spec_is_named(workspace_copy):
    from tests.conftest import mlp_variant

    line = '    expected_errors={"jax/tf/onnx/*": "jax2tf serialises through XlaCallModule, which tf2onnx cannot convert"},\n'
    root = workspace_copy(mlp_variant({line: line + "    batch_size=32,\n"}))
    result = invoke("check", "--workspace", str(root), "--path", "torch")
    assert_one_line_exit_2(result, "does not match the model spec", "'x' has shape [64, 64], the spec needs [32, 64]")
