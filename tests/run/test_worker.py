"""Worker log folders: kept for failed runs, removed after clean ones, old ones pruned."""

from __future__ import annotations

import os
import sys
import time

import pytest

from parity.platform.errors import TaskFailed
from parity.platform.safefs import owned_tempdir
from parity.run.pool import KEEP_LOG_DAYS, KEEP_LOG_RUNS, LOG_PREFIX, WorkerPool, prune_logs
from parity.run.processes import START_METHOD_VARIABLE, close_templates
from tests.conftest import dead_owner_tag


def test_old_log_folders_are_pruned_and_live_ones_kept(tmp_path):
    dead = dead_owner_tag()
    now = time.time()
    folders = []
    for index in range(KEEP_LOG_RUNS + 5):
        folder = tmp_path / f"{LOG_PREFIX}{dead}-{index:08d}"
        folder.mkdir()
        os.utime(folder, (now - index * 60,) * 2)
        folders.append(folder)
    ancient = folders[3]
    os.utime(ancient, (now - (KEEP_LOG_DAYS + 1) * 86400,) * 2)
    live = owned_tempdir(tmp_path, LOG_PREFIX)
    os.utime(live, (now - 10 * 86400 * KEEP_LOG_DAYS,) * 2)
    prune_logs(tmp_path)
    kept = {p.name for p in tmp_path.iterdir()}
    assert live.name in kept  # a running run's logs are never pruned
    assert ancient.name not in kept
    expected = [f for f in folders if f != ancient][:KEEP_LOG_RUNS]
    assert kept == {f.name for f in expected} | {live.name}


def test_clean_run_removes_its_logs_and_a_failed_run_keeps_them(tmp_path):
    with WorkerPool(1, tmp_path, timeout_s=60) as pool:
        assert pool.call("onnx", "parity.check.metrics:accuracy", logits=[[0.0, 1.0]], labels=[1]) == 1.0
        clean = pool.log_dir
    assert not clean.exists()
    with WorkerPool(1, tmp_path, timeout_s=60) as pool:
        with pytest.raises(TaskFailed, match="unknown path 'nope'") as caught:
            pool.call("onnx", "parity.run.paths:by_id", path_id="nope")
        assert caught.value.kind == "raised"
        failed = pool.log_dir
    assert (failed / "worker-onnx.log").is_file()


def loaded(name: str, load: bool = False) -> bool:
    """A task: whether this worker has imported ``name`` (``load``: after importing it)."""
    import importlib
    import sys

    if load:
        importlib.import_module(name)
    return name in sys.modules


def pid() -> int:
    return os.getpid()


LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers fork from templates on Linux")


@LINUX
def test_a_fresh_worker_is_forked_from_its_template_and_holds_nothing_of_the_one_before(tmp_path):
    with WorkerPool(1, tmp_path, timeout_s=120) as pool:
        first = pool.call("onnx", "tests.run.test_worker:pid")
        assert pool.call("onnx", "tests.run.test_worker:loaded", name="tests.usermodels", load=True)
        assert pool.call("onnx", "tests.run.test_worker:pid") == first  # the same worker until asked for a fresh one
        second = pool.call("onnx", "tests.run.test_worker:pid", fresh=True)
        assert second not in (first, os.getpid())
        assert not pool.call("onnx", "tests.run.test_worker:loaded", name="tests.usermodels")
        assert pool.call("onnx", "parity.run.worker:process_origin").startswith("forked from its group's template")
        template = pool.current.template
    with WorkerPool(1, tmp_path, timeout_s=120) as pool:  # a later run reuses the template
        pool.call("onnx", "tests.run.test_worker:pid")
        assert pool.current.template is template and template.alive


def warm_tabnanny() -> None:
    """A step's ``warm`` for the test below: an import no worker makes by itself."""
    import tabnanny  # noqa: F401


@LINUX
def test_a_template_runs_a_steps_warm_from_its_second_worker_for_the_step_and_a_fresh_worker_never_has_it(tmp_path):
    warm = {"warm": "tests.run.test_worker:warm_tabnanny"}
    seen = []
    for fresh in (False, False, True, False):  # a pool per call: each forks a new worker
        with WorkerPool(1, tmp_path, timeout_s=120) as pool:
            seen.append(pool.call("onnx", "tests.run.test_worker:loaded", fresh=fresh, name="tabnanny", **warm))
            if fresh:
                assert not pool.current.template.warmed  # a plain template, beside the warmed one
            else:
                warmed = pool.current.template
    # the first worker imports for itself; from the second on the template has; a fresh worker has imported
    # nothing but its frameworks (its time to first result counts what it imports); a later one forks warmed again
    assert seen == [False, True, False, True]
    assert warmed.warmed == {warm["warm"]}


@LINUX
def test_a_kept_template_forks_workers_that_run_with_this_processs_own_parity_variables(tmp_path, monkeypatch):
    def variable(pool, name):
        return pool.call("onnx", "os:getenv", key=name, fresh=True)

    monkeypatch.setenv("PARITY_MEMORY_LIMIT", "64G")
    monkeypatch.delenv("PARITY_STALL_TIMEOUT", raising=False)
    with WorkerPool(1, tmp_path, timeout_s=120) as pool:
        assert variable(pool, "PARITY_MEMORY_LIMIT") == "64G"
        template = pool.current.template
        monkeypatch.setenv("PARITY_MEMORY_LIMIT", "32G")
        monkeypatch.setenv("PARITY_STALL_TIMEOUT", "600")
        assert (variable(pool, "PARITY_MEMORY_LIMIT"), variable(pool, "PARITY_STALL_TIMEOUT")) == ("32G", "600")
        monkeypatch.delenv("PARITY_MEMORY_LIMIT")
        assert variable(pool, "PARITY_MEMORY_LIMIT") is None
        assert pool.current.template is template  # one template: parity's variables are not what it is kept by
    monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path / "another-cache"))
    with WorkerPool(1, tmp_path, timeout_s=120) as pool:
        assert variable(pool, "PARITY_CACHE_DIR") == str(tmp_path / "another-cache")
        assert pool.current.template is template


def autograph_file() -> str:
    """A task: a ``tf.function`` that autograph converts; the temporary file it wrote the converted code to."""
    import tensorflow as tf

    @tf.function
    def absolute(x):
        if x > 0:
            return x
        return -x

    absolute(tf.constant(1.0))
    return next(m.__file__ for n, m in sys.modules.items() if n.startswith("__autograph_generated_file"))


def test_a_tensorflow_worker_leaves_no_generated_source_behind(tmp_path):
    with WorkerPool(1, tmp_path, timeout_s=120) as pool:
        written = pool.call("tf", "tests.run.test_worker:autograph_file")
        assert os.path.isfile(written)
    assert not os.path.exists(written)  # removed as the worker ended, though it ends without the interpreter's exit


@LINUX
def test_a_forked_worker_that_dies_or_hangs_is_that_tasks_error(tmp_path):
    with WorkerPool(1, tmp_path, timeout_s=120) as pool:
        with pytest.raises(TaskFailed, match="died \\(exit code 3\\)") as died:
            pool.call("onnx", "os:_exit", status=3)
        assert died.value.kind == "died"
        with pytest.raises(TaskFailed, match="timed out after 0.5 s") as hung:
            pool.call("onnx", "tests.conftest:sleep", timeout_s=0.5, seconds=30)
        assert hung.value.kind == "timeout" and pool.current is None
        assert pool.call("onnx", "parity.check.metrics:accuracy", logits=[[0.0, 1.0]], labels=[1]) == 1.0


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_spare_is_adopted_by_the_first_group_and_closed_when_unused(tmp_path, monkeypatch, method):
    if method == "fork" and not sys.platform.startswith("linux"):
        pytest.skip("workers fork from templates on Linux")
    monkeypatch.setenv(START_METHOD_VARIABLE, method)
    close_templates()  # a spare template starts only where this process has none yet
    with WorkerPool(1, tmp_path, timeout_s=120) as pool:
        pool.prestart()
        spare = pool.spare
        assert spare is not None and pool.current_group() is None
        assert pool.call("onnx", "parity.check.metrics:accuracy", logits=[[0.0, 1.0]], labels=[1]) == 1.0
        assert pool.spare is None and pool.current_group() == "onnx"
        assert (pool.current.template if method == "fork" else pool.current) is spare
        assert pool.call("onnx", "parity.run.worker:process_origin") == (
            "spawned" if method == "spawn" else "forked from its group's template (framework import timed there)"
        )
    with WorkerPool(1, tmp_path, timeout_s=120) as pool:
        pool.prestart()
        unused = pool.spare
    assert unused is None if method == "fork" else not unused.alive  # a template for these settings exists now


def test_an_unknown_start_method_is_one_clear_error(monkeypatch, tmp_path):
    from parity.platform.errors import ParityError

    monkeypatch.setenv(START_METHOD_VARIABLE, "thread")
    with pytest.raises(ParityError, match="PARITY_WORKER_START='thread': use fork or spawn"):
        WorkerPool(1, tmp_path, timeout_s=10)
