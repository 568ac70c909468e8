"""``--executor ray`` on a real multi-node Ray cluster started here (``ray.cluster_utils.Cluster``: nodes on loopback
with different custom resources): cells placed by resource, the same verdicts as a local run, a cell that needs a
resource no node has skipped at once, a worker node killed mid-run survived, and --resume."""

from __future__ import annotations

import threading

import pytest

from parity.pipeline import jobs
from tests.conftest import REPO

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow

PATHS = ("torch", "torch/onnx/ort", "jax", "jax/onnx/ort", "tf")
TORCH = {"parity-torch": 1000.0, "parity-onnx": 1000.0, "parity-bench": 1.0}
JAX = {"parity-jax": 1000.0, "parity-onnx": 1000.0, "parity-bench": 1.0}


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    nodes = {"torch": c.add_node(num_cpus=1, resources=TORCH), "jax": c.add_node(num_cpus=1, resources=JAX)}
    ray.init(address=c.address, logging_level="ERROR", log_to_driver=False)
    c.wait_for_nodes()
    yield c, nodes
    ray.shutdown()
    c.shutdown()


def _check(tmp_path, executor="ray", paths=PATHS, **extra):
    request = jobs.CheckRequest(workspace=str(REPO), models=("mlp",), patterns=paths, threads=1, executor=executor,
                                store=str(tmp_path / "r.sqlite"), command="check", diagnose=None, **extra)
    reports = []
    code = jobs.check(request, show=reports.append)
    return code, reports[0]


def _verdicts(report) -> dict:
    return {r["path"]: r["verdict"] for r in report["results"]}


def test_cells_are_placed_by_resource_and_give_the_verdicts_of_a_local_run(cluster, tmp_path):
    c, nodes = cluster
    code, report = _check(tmp_path, address=c.address)
    _, local = _check(tmp_path, executor="local")
    assert _verdicts(report) == {**_verdicts(local), "tf": "skip"}
    by_path = {r["path"]: r for r in report["results"]}
    assert "parity-tf" in by_path["tf"]["reason"] and "worker-resources" in by_path["tf"]["reason"]
    assert {by_path[p]["node"]["id"] for p in ("torch", "torch/onnx/ort")} == {nodes["torch"].node_id}
    assert {by_path[p]["node"]["id"] for p in ("jax", "jax/onnx/ort")} == {nodes["jax"].node_id}
    assert by_path["torch"]["node"]["env"]["packages"]["torch"]
    assert code == 0 and report["executor"]["cells"] == 5


def test_a_worker_node_killed_mid_run_is_survived(cluster, tmp_path):
    c, nodes = cluster
    spare = c.add_node(num_cpus=1, resources=TORCH)
    c.wait_for_nodes()
    killed = threading.Event()

    def progress(message, **kw):
        if not killed.is_set():  # the first cell is back: kill the torch node while its other cells are queued there
            killed.set()
            c.remove_node(nodes["torch"], allow_graceful=False)

    request = jobs.CheckRequest(workspace=str(REPO), models=("mlp",), patterns=("torch", "torch/onnx/ort",
                                "torch/onnx/onnxref"), threads=1, executor="ray", address=c.address,
                                store=str(tmp_path / "r.sqlite"), command="check", diagnose=None)
    reports = []
    code = jobs.check(request, show=reports.append, progress=progress)
    assert killed.is_set()
    results = reports[0]["results"]
    assert [r["verdict"] for r in results] == ["pass"] * 3, [r.get("reason") for r in results]
    assert spare.node_id in {r["node"]["id"] for r in results}  # what the killed node had left ran on the spare
    assert code == 0


def test_resume_runs_only_the_cells_without_a_result(cluster, tmp_path):
    c, _ = cluster
    _, first = _check(tmp_path, address=c.address, paths=("jax", "jax/onnx/ort"))
    code, resumed = _check(tmp_path, address=c.address, paths=("jax", "jax/onnx/ort", "jax/onnx/onnxref"),
                           resume=first["run_id"])
    assert resumed["executor"]["reused"] == 2 and resumed["executor"]["resumed_from"] == first["run_id"]
    assert _verdicts(resumed) == {"jax": "pass", "jax/onnx/ort": "pass", "jax/onnx/onnxref": "pass"}
    assert code == 0
