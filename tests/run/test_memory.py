"""Memory said before it runs out: what is available, each step's estimate and its refusal, a worker stopped by parity
past the memory available or killed by the kernel, and ``parity plan``."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from parity.platform import memory
from parity.platform.errors import NotEnoughMemory, TaskFailed, UsageError
from parity.run import estimate
from parity.run.pool import WorkerPool

ACCURACY = {"logits": [[0.0, 1.0]], "labels": [1]}
MODEL = """
import torch


def make():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(4)])
"""


def hog(step_mb: int, most_mb: int) -> int:
    """A worker task that takes memory ``step_mb`` at a time, up to ``most_mb`` (then returns)."""
    held = []
    while len(held) * step_mb < most_mb:
        held.append(b"\x01" * (step_mb << 20))
        time.sleep(0.02)
    return len(held)


def hold(mb: int, seconds: float) -> None:
    """A worker task that holds ``mb`` of memory for ``seconds``."""
    held = b"\x01" * (mb << 20)
    time.sleep(seconds)
    del held


def read_pages(path: str) -> int:
    """A worker task that reads every page of the file ``path`` through a memory map, as a model mapped from its
    weight files does: resident pages of a file, which the kernel may drop, not memory of the worker's own."""
    import numpy as np

    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    return int(mapped[::4096].sum())


_KEPT: list = []


def keep(mb: int) -> int:
    """A worker task that leaves ``mb`` of memory held after it ends (as an exporter's caches do); its pid."""
    _KEPT.append(b"\x01" * (mb << 20))
    return os.getpid()


def test_a_worker_still_holding_memory_after_its_task_is_retired_and_the_next_task_starts_fresh(tmp_path):
    with WorkerPool(1, tmp_path, timeout_s=120) as pool:
        first = pool.call("onnx", "tests.run.test_memory:keep", mb=1)
        pool.retire_if_holding(limit=1 << 40)  # holds far less: kept for the next task
        assert pool.call("onnx", "tests.run.test_memory:keep", mb=300) == first
        pool.retire_if_holding(limit=200 << 20)  # holds 300 MB more than that: closed
        assert pool.current is None
        assert pool.call("onnx", "tests.run.test_memory:keep", mb=1) != first


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [("12G", 12 * 10**9), ("800M", 800 * 10**6), ("800MB", 800 * 10**6), ("1.5GiB", 3 << 29), ("7e9", 7 * 10**9)],
)
def test_a_memory_limit_reads_units(monkeypatch, text, nbytes):
    monkeypatch.setenv(memory.LIMIT_VARIABLE, text)
    assert memory.available() == memory.Available(nbytes, memory.LIMIT_VARIABLE)


@pytest.mark.parametrize("text", ["lots", "0", "-1G", "12X", "GiB"])
def test_a_bad_memory_limit_is_one_clear_error(monkeypatch, text):
    monkeypatch.setenv(memory.LIMIT_VARIABLE, text)
    with pytest.raises(UsageError, match=rf"^{memory.LIMIT_VARIABLE}=.*give a size in bytes"):
        memory.available()


def test_a_cgroup_allows_its_limit_less_what_it_uses_its_page_cache_counted_free(tmp_path):
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.max").write_text("8000000000\n")
    (v2 / "memory.current").write_text("3000000000\n")
    (v2 / "memory.stat").write_text("anon 2000000000\ninactive_file 1000000000\n")
    assert memory.cgroup_available(v2) == 6_000_000_000
    (v2 / "memory.max").write_text("max\n")
    assert memory.cgroup_available(v2) is None
    v1 = tmp_path / "v1"
    v1.mkdir()
    (v1 / "memory.limit_in_bytes").write_text("4000000000\n")
    (v1 / "memory.usage_in_bytes").write_text("1000000000\n")
    assert memory.cgroup_available(v1) == 3_000_000_000
    (v1 / "memory.limit_in_bytes").write_text(str(2**63 - 4096))  # "no limit"
    assert memory.cgroup_available(v1) is None
    assert memory.cgroup_available(tmp_path / "absent") is None
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:   20000000 kB\n")
    assert memory.meminfo_available(meminfo) == 20_000_000 * 1024


def test_a_step_that_does_not_fit_is_refused_in_one_line_with_the_options():
    here = memory.Available(2 * 10**9, "MemAvailable")
    need = estimate.peak("reference", 10**9)
    assert need > 4 * 10**9  # a float64 copy beside the float32 model
    with pytest.raises(NotEnoughMemory) as refused:
        estimate.refuse("llama", "reference", need, here)
    line = str(refused.value)
    assert "\n" not in line and line.startswith("llama: the float64 reference (a whole float64 copy) needs about 4.")
    for said in (
        "2.0 GB available (MemAvailable)",
        "PARITY_REFERENCE=streamed",
        "a smaller batch",
        "--memory=",
        "SIZE",
    ):
        assert said in line
    estimate.refuse("llama", "reference", need, memory.Available(need, "MemAvailable"))  # it fits: nothing said
    assert estimate.peak("streamed", 10**10) < estimate.peak("reference", 10**10) / 2


def test_a_golden_build_that_cannot_fit_is_refused_before_it_starts(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from parity.cli import cli

    (tmp_path / "big.py").write_text(MODEL)
    monkeypatch.chdir(tmp_path)
    made = CliRunner().invoke(
        cli, ["init", "big", "--torch", "big.py:make", "--input", "x=2x2048", "--workspace", str(tmp_path)]
    )
    assert made.exit_code == 0, made.output
    monkeypatch.setenv(memory.LIMIT_VARIABLE, "100M")  # the model's 67 MB of weights, built: about 134 MB
    built = CliRunner().invoke(cli, ["golden", "build", "--model", "big", "--workspace", str(tmp_path)])
    assert built.exit_code == 2, built.output
    assert "Traceback" not in built.output
    line = next(line for line in built.output.splitlines() if "golden build failed" in line)
    assert "big: golden build failed: big: the model built in float32 needs about 634 MB" in line
    assert "100 MB available (PARITY_MEMORY_LIMIT)" in line and "a smaller batch" in line
    assert not (tmp_path / "golden" / "big").exists()


def test_a_worker_past_the_memory_available_is_stopped_by_parity_and_said_out_of_memory(tmp_path, monkeypatch):
    with WorkerPool(1, tmp_path, timeout_s=120) as pool:
        pool.call("onnx", "parity.check.metrics:accuracy", **ACCURACY)  # the worker is up: what follows is the task
        monkeypatch.setenv(memory.LIMIT_VARIABLE, "300M")
        with pytest.raises(TaskFailed) as stopped:
            pool.call("onnx", "tests.run.test_memory:hog", step_mb=20, most_mb=3000)
        message = str(stopped.value)
        assert stopped.value.kind == "oom" and pool.current is None
        assert message.startswith("out of memory: the onnx worker reached ")
        assert "past the 300 MB available (PARITY_MEMORY_LIMIT)" in message
        assert pool.last_peak_bytes is not None and pool.last_peak_bytes - 300e6 < 1.5e9  # stopped well before 3 GB
        monkeypatch.delenv(memory.LIMIT_VARIABLE)
        assert pool.call("onnx", "parity.check.metrics:accuracy", **ACCURACY) == 1.0  # a fresh worker goes on


def test_the_pages_of_a_mapped_file_are_not_memory_a_worker_is_stopped_for(tmp_path, monkeypatch):
    big = tmp_path / "weights.bin"
    with open(big, "wb") as f:
        f.truncate(600 << 20)  # read through a map, each page is resident and the file's
    with WorkerPool(1, tmp_path, timeout_s=120) as pool:
        pool.call("onnx", "parity.check.metrics:accuracy", **ACCURACY)
        monkeypatch.setenv(memory.LIMIT_VARIABLE, "200M")
        assert pool.call("onnx", "tests.run.test_memory:read_pages", path=str(big)) == 0
        assert pool.last_peak_bytes is not None and pool.last_peak_bytes > 500e6  # resident, said as such
        with pytest.raises(TaskFailed) as stopped:  # memory of its own past the limit is stopped as before
            pool.call("onnx", "tests.run.test_memory:hog", step_mb=20, most_mb=3000)
        assert stopped.value.kind == "oom"


def test_a_worker_killed_from_outside_is_said_killed_by_the_kernel_with_its_peak(tmp_path):
    with WorkerPool(1, tmp_path, timeout_s=120) as pool:
        pool.call("onnx", "parity.check.metrics:accuracy", **ACCURACY)
        pid = pool.current.process.pid
        threading.Timer(3.0, os.kill, (pid, signal.SIGKILL)).start()
        with pytest.raises(TaskFailed) as killed:
            pool.call("onnx", "tests.run.test_memory:hold", mb=200, seconds=60)
        message = str(killed.value)
        assert killed.value.kind == "oom", message
        assert message.startswith("the onnx worker was killed by the kernel (SIGKILL), most likely out of memory: ")
        assert "its peak was " in message and " available (" in message and "died (exit code" not in message
        assert pool.last_peak_bytes > 200e6  # the memory it held when it was killed


def test_each_task_records_its_peak_memory(tmp_path):
    with WorkerPool(1, tmp_path, timeout_s=120) as pool:
        pool.call("onnx", "tests.run.test_memory:hold", mb=150, seconds=0.1)
        assert pool.last_peak_bytes > 150e6  # the kernel's high-water mark: a short task is seen too
        assert pool.peaks["tests.run.test_memory:hold"] == pool.last_peak_bytes


def test_plan_of_a_7b_model_says_what_does_not_fit_and_the_ray_node_it_would(monkeypatch):
    from click.testing import CliRunner

    from parity.cli import cli

    monkeypatch.setenv(memory.LIMIT_VARIABLE, "23G")
    result = CliRunner().invoke(cli, ["plan", "--params", "7e9"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("a Llama-shaped model of 7e+09 parameters at 2 x 64 tokens: 28.0 GB of float32 weights")
    assert "23.0 GB available (PARITY_MEMORY_LIMIT)" in lines[0]
    export = next(line for line in lines if "torch.onnx (dynamo) export" in line)
    assert "no: a Ray node with memory=" in export and "62.2 GB" in export
    ort = next(line for line in lines if "ONNX Runtime session" in line)
    assert "no: a Ray node with memory=" in ort  # 1.1 x 28 GB: more than 23 GB too
    diagnosis = next(line for line in lines if line.startswith("diagnosis "))
    assert "diagnosis beside an ONNX Runtime session" in diagnosis and "no: a Ray node with memory=" in diagnosis
    small = CliRunner().invoke(cli, ["plan", "--params", "20e6"])
    assert small.exit_code == 0 and "no:" not in small.output
    bad = CliRunner().invoke(cli, ["plan", "--params", "7e9", "--model", "mlp"])
    assert bad.exit_code == 2 and "give --model NAME or --params COUNT" in bad.output
    mapped = CliRunner().invoke(cli, ["plan", "--params", "7e9", "--mapped"]).output.splitlines()
    assert mapped[0].startswith("a Llama-shaped model of 7e+09 parameters at 2 x 64 tokens, its weights mapped from")
    golden = [line for line in mapped if line.startswith("golden build")]
    assert "model mapped from its weight files" in golden[0] and golden[0].endswith("yes")
    assert "float64 reference streamed from the weight files" in golden[1] and golden[1].endswith("yes")
    assert "float32 run" in golden[2] and "no: a Ray node" in golden[2]  # the float32 noise floor: left out


def test_the_table_holds_every_measured_factor_and_measures_every_row_it_does_not_derive():
    measured = json.loads((Path(__file__).resolve().parents[2] / "scripts" / "memory_factors.json").read_text())
    seen = set()
    for run in measured["runs"]:
        for step in run["steps"]:
            assert step["step"] not in estimate.DERIVED, step  # a derived row is a sum of measured ones
            assert estimate.COSTS[step["step"]].copies >= step["factor"], (run["model"], step)
            seen.add(step["step"])
    assert seen == set(estimate.COSTS) - set(estimate.DERIVED)
    assert estimate.COSTS["gradients"].copies == estimate.COSTS["reference"].copies + 2.0
    assert estimate.COSTS["diagnose"].copies == 1.0 + estimate.COSTS["ort"].copies


@pytest.mark.parametrize("params", ["nan", "inf", "-inf", "0", "-1e9", "1e40"])
def test_plan_of_a_size_that_is_no_model_is_one_line_and_exit_2(params):
    from click.testing import CliRunner

    from parity.cli import cli

    result = CliRunner().invoke(cli, ["plan", "--params", params])
    assert result.exit_code == 2, result.output
    assert "give a number of parameters above 0 and at most 1e+13" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_each_step_of_a_reference_with_gradients_a_check_and_a_diagnosis_is_estimated():
    user = {"workspace": "w", "model": "m", "out_file": "o"}
    assert estimate.step_of("parity.golden.user_tasks:reference", {**user, "gradients": False}) == "reference"
    assert estimate.step_of("parity.golden.user_tasks:reference", {**user, "gradients": True}) == "gradients"
    for path, step in (("torch/onnx/ort-noopt", "ort"), ("onnx/onnxref", "onnxref"), ("torch/onnx/onnxref", "onnxref")):
        assert estimate.step_of("parity.run.tasks:check_path", {"path_id": path}) == step, path
    for task in [f"parity.diagnose.{m}:{f}" for m, functions in estimate.DIAGNOSIS_TASKS.items() for f in functions]:
        assert estimate.step_of(task, {"path_id": "torch/onnx/ort"}) == "diagnose", task
        assert estimate.step_of(task, {"path_id": "torch/onnx/onnxref"}) == "diagnose_onnxref", task
    assert estimate.step_of("parity.diagnose.eval_split:reference_rows", {}) == "reference"
    assert estimate.step_of("parity.diagnose.repro:write", {"path_id": "torch/onnx/ort"}) is None
    weights = 4 * 10**9
    assert estimate.peak("gradients", weights) == pytest.approx(estimate.peak("reference", weights) + 2 * weights)
    # the float32 model and its session, and one unit of the model in float64 (a sixteenth of a big one)
    assert estimate.peak("diagnose", weights) == pytest.approx(estimate.WORKER_BYTES + weights * (1.0 + 1.1 + 2 / 16))
    with pytest.raises(NotEnoughMemory) as refused:
        estimate.refuse("llama", "gradients", estimate.peak("gradients", weights), memory.Available(weights, "x"))
    assert "gradients" in str(refused.value) and "loss=None" in str(refused.value)
    assert "PARITY_REFERENCE=streamed" not in str(refused.value)  # a streamed reference has no gradients


def test_a_model_mapped_from_its_weight_files_is_estimated_without_its_float32_copy(tmp_path, monkeypatch):
    """The float32 weights of a model mapped from its safetensors files are pages of the files: its load and its
    streamed float64 reference fit where the same model held in memory is refused; a float32 run still needs it."""
    monkeypatch.setenv(memory.LIMIT_VARIABLE, "8G")
    weights = 10 * 10**9
    reference = ("parity.golden.user_tasks:reference", {"model": "big", "gradients": False})
    load = ("parity.golden.user_tasks:describe_weights", {"model": "big"})
    floor = ("parity.golden.floor:float32_floor", {"model": "big"})
    with WorkerPool(1, tmp_path, timeout_s=60) as pool:
        with pool.for_model(weights):
            for task, kwargs in (reference, load, floor):
                with pytest.raises(NotEnoughMemory, match=r"^big: the "):
                    pool.check_memory("torch", task, kwargs)
        with pool.for_model(weights, mapped=True):
            pool.check_memory("torch", *reference)  # one unit in float64 (and the activations): no refusal
            pool.check_memory("torch", *load)
            with pytest.raises(NotEnoughMemory, match=r"^big: the float32 run needs about 20\.5 GB"):
                pool.check_memory("torch", *floor)
        assert not pool.mapped  # the block's model only
    unit = 2 * weights // 16
    assert estimate.peak("streamed_files", weights) == pytest.approx(
        estimate.WORKER_BYTES + weights * 0.4 + unit, abs=2
    )
    assert estimate.torch_step("reference", weights, mapped=True) == "streamed_files"
    assert estimate.torch_step("reference", 10**8, mapped=True) == "reference"  # a small model is still cast whole
