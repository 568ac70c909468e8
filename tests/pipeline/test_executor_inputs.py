"""What --executor ray needs that can be checked without a cluster: the workspace bundle verified where it arrives,
the resources a node advertises and a cell requests, one-line refusals."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from parity.cli import cli
from parity.pipeline import bundle
from parity.platform.errors import ParityError
from parity.run import paths, stacks
from tests.conftest import REPO


def test_a_bundle_arrives_verified_and_a_tampered_one_is_refused(tmp_path):
    packed = bundle.pack(REPO, ["mlp"])
    assert "models/mlp.py" in packed["files"] and "golden/mlp/manifest.json" in packed["files"]
    root = bundle.unpack(packed, tmp_path)
    assert (
        root.name == packed["digest"]
        and (root / "golden" / "mlp" / "weights.npz").read_bytes()
        == (REPO / "golden" / "mlp" / "weights.npz").read_bytes()
    )
    assert bundle.unpack(packed, tmp_path) == root  # once per node: verified again, reused
    (root / "models" / "mlp.py").write_text("tampered")
    assert (
        bundle.unpack(packed, tmp_path) == root
        and (root / "models" / "mlp.py").read_bytes() == packed["files"]["models/mlp.py"]
    )  # rewritten from the bundle, not trusted
    bad = {**packed, "files": {**packed["files"], "models/mlp.py": b"changed in transit"}}
    with pytest.raises(ParityError, match="another sha256"):
        bundle.unpack(bad, tmp_path / "other")
    escape = {**packed, "files": {"../x": b""}, "sha256": {"../x": bundle._sha(b"")}}
    escape["digest"] = bundle._digest(escape["sha256"])
    with pytest.raises(ParityError, match="outside it"):
        bundle.unpack(escape, tmp_path / "other")


def test_a_cell_requests_the_stacks_of_its_steps_and_a_node_advertises_what_it_has():
    assert stacks.needed(paths.by_id("tf/onnx/ort", "cpu", "fp32")) == {"parity-tf": 1.0, "parity-onnx": 1.0}
    assert stacks.needed(paths.by_id("torch", "cpu", "fp32")) == {"parity-torch": 1.0}
    from parity.pipeline.ray_executor import _request
    from parity.pipeline.ray_nodes import missing as _missing

    gpu = paths.by_id("torch/onnx/ort", "cuda", "fp32")
    timed = _request(gpu, timing=True, threads=4, accelerator="H100")
    assert timed == {
        "num_cpus": 4.0,
        "num_gpus": 1.0,
        "resources": {"parity-torch": 1.0, "parity-onnx": 1.0, "parity-bench": 1.0, "accelerator_type:H100": 0.001},
    }
    assert _request(gpu, timing=False, threads=4)["num_gpus"] == 0.25
    assert _missing(timed, {"CPU": 8.0, "GPU": 1.0, "parity-torch": 1e3, "parity-onnx": 1e3, "parity-bench": 1.0}) == [
        "accelerator_type:H100 0.001"
    ]
    out = CliRunner().invoke(cli, ["worker-resources"])
    advertised = json.loads(out.output)
    assert advertised["parity-bench"] == 1.0 and advertised["parity-torch"] > 1 and "parity-trt" not in advertised


def test_resume_without_the_ray_executor_and_without_a_store_is_one_line(tmp_path):
    runner = CliRunner()
    base = ["check", "--workspace", str(REPO), "--model", "mlp", "--path", "torch"]
    result = runner.invoke(cli, [*base, "--resume", "x", "--store", str(tmp_path / "r.sqlite")])
    assert result.exit_code == 2 and "--resume" in result.output and "Traceback" not in result.output
    result = runner.invoke(cli, [*base, "--resume", "x", "--no-store", "--executor", "ray"])
    assert result.exit_code == 2 and "--no-store" in result.output
