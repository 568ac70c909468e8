"""``--executor ray`` on a real multi-node Ray cluster started here (``ray.cluster_utils.Cluster``: nodes on loopback
with different custom resources, slow set): cells placed by resource, the same verdicts as a local run, a cell that
needs a resource no node has skipped at once, a node that declares nothing probed and used for what it has
installed, a run that checked nothing exiting 2, a worker node killed mid-run survived, and --resume. Where a cell
goes among declared and probed nodes is tested on node descriptions alone (fast)."""

from __future__ import annotations

import threading

import pytest

from parity.pipeline import jobs
from parity.pipeline.ray_executor import _request
from parity.pipeline.ray_nodes import NODE_LABEL, Node, place
from parity.run import paths
from tests.conftest import REPO

ray = pytest.importorskip("ray")

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
    request = jobs.CheckRequest(
        workspace=str(REPO),
        models=("mlp",),
        patterns=paths,
        threads=1,
        executor=executor,
        store=str(tmp_path / "r.sqlite"),
        command="check",
        diagnose=None,
        **extra,
    )
    reports = []
    code = jobs.check(request, show=reports.append)
    return code, reports[0]


def _verdicts(report) -> dict:
    return {r["path"]: r["verdict"] for r in report["results"]}


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_node_that_declares_nothing_runs_what_is_installed_there_and_a_run_that_checks_nothing_exits_2(
    cluster, tmp_path
):
    c, nodes = cluster
    request = jobs.CheckRequest(
        workspace=str(REPO),
        models=("mlp",),
        patterns=("tf",),
        threads=1,
        executor="ray",
        address=c.address,
        store=str(tmp_path / "r.sqlite"),
        command="check",
        diagnose=None,
    )
    reports, notes = [], []
    assert jobs.check(request, show=reports.append, notice=notes.append) == 2  # no node can run tf: nothing checked
    assert _verdicts(reports[0]) == {"tf": "skip"}
    assert notes[-1].startswith("error: nothing was checked") and "parity-tf" in notes[-1]
    plain = c.add_node(num_cpus=1)  # as `ray start --address HEAD` with no options: none of parity's resources
    c.wait_for_nodes()
    try:
        code, report = _check(tmp_path, address=c.address, paths=("tf", "jax"))
    finally:
        c.remove_node(plain)
    by_path = {r["path"]: r for r in report["results"]}
    assert _verdicts(report) == {"tf": "pass", "jax": "pass"}, [r.get("reason") for r in report["results"]]
    assert by_path["tf"]["node"]["id"] == plain.node_id  # probed: tensorflow is installed there
    assert by_path["jax"]["node"]["id"] == nodes["jax"].node_id  # a node that declares jax takes the jax cell
    assert code == 0


@pytest.mark.slow
def test_a_worker_node_killed_mid_run_is_survived(cluster, tmp_path):
    c, nodes = cluster
    spare = c.add_node(num_cpus=1, resources=TORCH)
    c.wait_for_nodes()
    killed = threading.Event()

    def progress(message, **kw):
        if not killed.is_set():  # the first cell is back: kill the torch node while its other cells are queued there
            killed.set()
            c.remove_node(nodes["torch"], allow_graceful=False)

    request = jobs.CheckRequest(
        workspace=str(REPO),
        models=("mlp",),
        patterns=("torch", "torch/onnx/ort", "torch/onnx/onnxref"),
        threads=1,
        executor="ray",
        address=c.address,
        store=str(tmp_path / "r.sqlite"),
        command="check",
        diagnose=None,
    )
    reports = []
    code = jobs.check(request, show=reports.append, progress=progress)
    assert killed.is_set()
    results = reports[0]["results"]
    assert [r["verdict"] for r in results] == ["pass"] * 3, [r.get("reason") for r in results]
    assert spare.node_id in {r["node"]["id"] for r in results}  # what the killed node had left ran on the spare
    assert code == 0


@pytest.mark.slow
def test_resume_runs_only_the_cells_without_a_result(cluster, tmp_path):
    c, _ = cluster
    _, first = _check(tmp_path, address=c.address, paths=("jax", "jax/onnx/ort"))
    code, resumed = _check(
        tmp_path, address=c.address, paths=("jax", "jax/onnx/ort", "jax/onnx/onnxref"), resume=first["run_id"]
    )
    assert resumed["executor"]["reused"] == 2 and resumed["executor"]["resumed_from"] == first["run_id"]
    assert _verdicts(resumed) == {"jax": "pass", "jax/onnx/ort": "pass", "jax/onnx/onnxref": "pass"}
    assert code == 0


# --- a run that checked nothing, and where a cell goes, on node descriptions alone ----------------------------------


def test_a_local_run_that_checks_nothing_exits_2_and_says_why_in_one_line():
    from click.testing import CliRunner

    from parity.cli import cli

    result = CliRunner().invoke(
        cli,
        ["check", "--workspace", str(REPO), "--model", "mlp", "--path", "torch", "--precision", "tf32", "--no-store"],
        catch_exceptions=False,
    )
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "mlp    torch  skip" in result.stdout  # the verdicts are shown all the same
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: nothing was checked: every selected path was skipped (torch: TF32 is a tensor-core")


INSTALLED = {"parity-torch": 1000.0, "parity-tf": 1000.0, "parity-jax": 1000.0, "parity-onnx": 1000.0}


def _cell(path_id, device="cpu", timing=False, threads=1):
    return _request(paths.by_id(path_id, device, "fp32"), timing=timing, threads=threads)


def test_a_cell_goes_to_declared_nodes_else_by_label_to_probed_nodes_that_have_its_stacks():
    declared = Node("d", "d", {"CPU": 4.0, **TORCH}, declared=True)
    head = Node("h", "h", {"CPU": 0.0, **INSTALLED})  # probed, no CPU: runs no cell
    small, big, big2 = (Node(n, n, {"CPU": c, **INSTALLED}) for n, c in (("p1", 2.0), ("p2", 4.0), ("p3", 4.0)))
    cluster = [declared, head, small, big, big2]
    assert place(_cell("torch"), cluster, timing=False) == (_cell("torch"), None)  # declared: by resource
    options, why = place(_cell("tf/onnx/ort"), cluster, timing=False)
    assert why is None and options == {
        "num_cpus": 1.0,
        "num_gpus": 0.0,
        "resources": {},
        "label_selector": {NODE_LABEL: "in(p1,p2,p3)"},
    }
    options, _ = place(_cell("tf", timing=True), cluster, timing=True)  # no parity-bench there: a whole node
    assert options["num_cpus"] == 4.0 and options["label_selector"] == {NODE_LABEL: "in(p2,p3)"}
    assert "parity-bench" not in options["resources"]
    options, _ = place(_cell("tf"), [declared, small], timing=False)
    assert options["label_selector"] == {NODE_LABEL: "p1"}


def test_a_cell_no_node_can_run_is_skipped_with_what_is_missing():
    declared = Node("d", "d", {"CPU": 4.0, **TORCH}, declared=True)
    head = Node("h", "h", {"CPU": 0.0, **INSTALLED})
    options, why = place(_cell("tf"), [declared, head], timing=False)
    assert options is None and why.startswith("no node of the cluster has parity-tf 1 (")
    assert "worker-resources" in why
    _, why = place(_cell("torch", device="cuda"), [declared, Node("p", "p", {"CPU": 2.0, **INSTALLED})], False)
    assert why.startswith("no node of the cluster has GPU 0.25")
    lost = Node("x", "gpu-box", {"CPU": 8.0}, problem="its probe failed (ModuleNotFoundError: parity)")
    _, why = place(_cell("tf"), [declared, lost], timing=False)
    assert "gpu-box: its probe failed (ModuleNotFoundError: parity)" in why
