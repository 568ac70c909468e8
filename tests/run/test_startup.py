"""What a small check costs besides its runtime: verdicts kept across processes (the manifest's schema check), nothing
imported that the check does not need (jsonschema, SQLAlchemy, onnx in the orchestrator), no script run twice by a
worker, the process ended without the interpreter's teardown; and the golden data still refused when tampered with."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from parity.cli import cli
from parity.golden import store as golden
from parity.model import manifest as manifest_lib
from parity.platform.errors import GoldenError
from parity.results import store as results
from tests.conftest import reseal

# NumPy too: the check's process verifies the golden files and the spec from the manifest; arrays are the worker's
HEAVY = ("jsonschema", "sqlalchemy", "numpy", "onnx", "onnxruntime", "torch", "tensorflow", "jax")


def run_python(code: str, cache: Path, cwd: Path | None = None, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PARITY_CACHE_DIR": str(cache)}
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


READ_MANIFEST = """
import json, sys
from parity.model import manifest
manifest.read(sys.argv[1])
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] == "jsonschema")))
"""


def test_a_manifest_found_valid_is_not_validated_again_by_a_later_process(workspace_copy, tmp_path):
    path = workspace_copy() / "golden" / "mlp" / "manifest.json"
    cache = tmp_path / "cache"
    first = run_python(READ_MANIFEST, cache, None, str(path))
    assert json.loads(first.stdout.splitlines()[-1])  # validated: jsonschema loaded, the verdict kept
    assert list((cache / manifest_lib.VALID_FOLDER).rglob("*"))
    second = run_python(READ_MANIFEST, cache, None, str(path))
    assert json.loads(second.stdout.splitlines()[-1]) == []  # the same bytes: the kept verdict, no jsonschema


def test_a_tampered_golden_is_refused_though_its_manifest_verdict_is_kept(workspace_copy, monkeypatch):
    root = workspace_copy()
    folder = root / "golden" / "mlp"
    golden.verify(folder)  # the verdict on these manifest bytes is kept in the cache
    monkeypatch.setattr(manifest_lib, "_SCHEMA_VALID", set())  # as a new process finds it: only the verdict file
    reference = folder / "reference.npz"
    original = reference.read_bytes()
    data = bytearray(original)
    data[-40] ^= 0xFF
    reference.write_bytes(bytes(data))
    with pytest.raises(GoldenError, match="reference.npz: sha256 mismatch"):
        golden.verify(folder)
    reference.write_bytes(original)
    golden.verify(folder)
    manifest_path = folder / "manifest.json"
    text = manifest_path.read_text()
    assert '"batch_size": 64' in text
    manifest_path.write_text(text.replace('"batch_size": 64', '"batch_size": 65'))  # edited, digest not recomputed
    with pytest.raises(GoldenError, match="manifest digest mismatch"):
        golden.verify(folder)
    manifest_path.write_text(text)
    # sealed again after an edit the schema forbids: new bytes, validated afresh
    reseal(folder, edit=lambda m: m.update(batch_size="64"))
    with pytest.raises(GoldenError, match="invalid manifest field batch_size"):
        golden.verify(folder)


def _tiny_onnx(folder: Path, external: bool = False) -> Path:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b"),
    ]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tiny.onnx"
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=external,
        all_tensors_to_one_file=True,
        location="tiny.weights",
        size_threshold=0,
    )
    return path


DIGEST = """
import json, sys
from parity.interop.onnx_file import source_digest
print(source_digest(sys.argv[1]))
print(json.dumps("onnx" in sys.modules))
"""


def test_a_source_digest_parses_only_a_file_that_names_external_data(tmp_path):
    from parity.platform.safefs import sha256_file

    plain = _tiny_onnx(tmp_path / "plain")
    digest, parsed = run_python(DIGEST, tmp_path / "cache", None, str(plain)).stdout.split()
    assert digest == sha256_file(plain) and json.loads(parsed) is False  # hashed, never parsed
    outside = _tiny_onnx(tmp_path / "external", external=True)
    digest, parsed = run_python(DIGEST, tmp_path / "cache", None, str(outside)).stdout.split()
    assert json.loads(parsed) is True and digest != sha256_file(outside)
    data = outside.with_name("tiny.weights")
    data.write_bytes(data.read_bytes()[:-4] + b"\0\0\0\0")  # a changed data file is a changed model
    assert run_python(DIGEST, tmp_path / "cache", None, str(outside)).stdout.split()[0] != digest


SCRIPT = """
import sys
with open(sys.argv[1], "a") as marker:  # at module level: what a script without a main guard does
    marker.write("ran\\n")
if __name__ == "__main__":
    from pathlib import Path
    from parity.run.pool import WorkerPool

    with WorkerPool(1, Path(sys.argv[2]), 120) as pool:
        pool.prestart()
        assert pool.call("onnx", "parity.run.paths:load_target", target="parity.run.paths:load_target")
"""


def test_a_worker_never_runs_the_callers_script_again(tmp_path):
    script, marker = tmp_path / "user_script.py", tmp_path / "marker.txt"
    script.write_text(SCRIPT)
    env = {**os.environ, "PARITY_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, str(script), str(marker), str(tmp_path / "logs")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert marker.read_text() == "ran\n"  # once: in the script's own process, in no worker


def test_the_store_columns_appended_without_sqlalchemy_are_the_tables(tmp_path):
    url = f"sqlite:///{tmp_path / 'r.sqlite'}"
    made = results.Store.open(url)  # a new store: made through SQLAlchemy
    assert tuple(c.name for c in made.series.columns if c.name != "id") == results.SERIES_COLUMNS
    opened = results.Store.open(url)
    assert "engine" not in opened.__dict__  # an existing store of this version: opened with sqlite3
    document = {
        "schema": "parity.result/2",
        "env": {"cpu": "Test CPU", "cpu_count": 2},
        "model_errors": [],
        "results": [
            {
                "model": "m",
                "path": "onnx/ort",
                "device": "cpu",
                "precision": "fp32",
                "verdict": "pass",
                "outputs": {"y": {"tol_units": 0.25}},
                "timing": None,
            }
        ],
    }
    run_id = opened.append(document, "check", tmp_path, 0)
    (run,) = results.Store.open(url).history()  # read back through SQLAlchemy, made on first use
    assert run["id"] == run_id and run["hardware"] == "Test CPU x2"
    assert [(r["path"], r["verdict"], r["tol_units"]) for r in run["rows"]] == [("onnx/ort", "pass", 0.25)]
    assert results.Store.open(url).document(run_id)["results"][0]["verdict"] == "pass"


CHECK = """
import json, sys
from parity.cli import cli
try:
    cli(["check", "-m", "tiny", "-p", "onnx/ort", "--store", sys.argv[1]], prog_name="parity")
except SystemExit as done:
    code = done.code
print(json.dumps({"code": code, "heavy": sorted(m for m in sys.modules if m.split(".")[0] in HEAVY)}))
""".replace("HEAVY", repr(HEAVY))


def test_a_cached_check_loads_no_schema_store_or_framework_library_and_still_refuses_a_tampered_golden(tmp_path):
    root, cache, store_file = tmp_path / "ws", tmp_path / "cache", tmp_path / "runs.sqlite"
    model = _tiny_onnx(root)

    def invoke(*args):
        return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)

    assert invoke("init", "tiny", "--workspace", root, "--onnx", model, "--input", "x=2x8").exit_code == 0
    built = invoke("golden", "build", "--workspace", root, "--model", "tiny")
    assert built.exit_code == 0, built.output
    first = json.loads(run_python(CHECK, cache, root, str(store_file)).stdout.splitlines()[-1])
    assert first["code"] == 0  # the store made, the export cached, the manifest's verdict kept
    again = json.loads(run_python(CHECK, cache, root, str(store_file)).stdout.splitlines()[-1])
    assert again == {"code": 0, "heavy": []}
    assert len(results.Store.open(f"sqlite:///{store_file}").run_ids()) == 2  # both runs stored
    inputs = root / "golden" / "tiny" / "inputs.npz"
    data = bytearray(inputs.read_bytes())
    data[-40] ^= 0xFF
    inputs.write_bytes(bytes(data))
    env = {**os.environ, "PARITY_CACHE_DIR": str(cache)}
    refused = subprocess.run(
        [sys.executable, "-m", "parity", "check", "-m", "tiny", "-p", "onnx/ort", "--store", str(store_file)],
        cwd=root,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "inputs.npz: sha256 mismatch" in refused.stdout + refused.stderr


def test_the_command_ends_with_its_exit_code_and_its_output_flushed(tmp_path):
    env = {**os.environ, "PARITY_CACHE_DIR": str(tmp_path / "cache")}
    shown = subprocess.run(
        [sys.executable, "-m", "parity", "--help"], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert shown.returncode == 0 and "Usage: parity" in shown.stdout and "Commands:" in shown.stdout
    (tmp_path / "models").mkdir()
    refused = subprocess.run(
        [sys.executable, "-m", "parity", "check", "-m", "nope"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert refused.returncode == 2 and refused.stderr.strip().startswith("error: unknown model 'nope'")


def test_the_plans_verification_reads_no_array_yet_refuses_a_spec_the_golden_does_not_fit(workspace_copy):
    from parity.golden import store
    from parity.model.workspace import Workspace
    from parity.platform.errors import GoldenError

    ws = Workspace(workspace_copy())
    spec = ws.load_spec("mlp")
    assert store.verified_manifest(ws.golden_dir("mlp"), spec) == store.verify(ws.golden_dir("mlp"), spec)
    name, param = next(iter(spec.params.items()))
    edited = dataclasses.replace(
        spec, params={**spec.params, name: dataclasses.replace(param, shape=(*param.shape, 2))}
    )
    with pytest.raises(GoldenError, match=f"weights.npz {name!r} has shape") as caught:
        store.verified_manifest(ws.golden_dir("mlp"), edited)
    with pytest.raises(GoldenError) as full:
        store.verify(ws.golden_dir("mlp"), edited)
    assert str(caught.value) == str(full.value)  # the same refusal as the check that reads every array
