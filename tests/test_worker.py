"""Worker log folders: kept for failed runs, removed after clean ones, old ones pruned."""

from __future__ import annotations

import os
import time

import pytest

from parity.platform.safefs import owned_tempdir
from parity.run import worker
from tests.conftest import dead_owner_tag


def test_old_log_folders_are_pruned_and_live_ones_kept(tmp_path):
    dead = dead_owner_tag()
    now = time.time()
    folders = []
    for index in range(worker.KEEP_LOG_RUNS + 5):
        folder = tmp_path / f"{worker.LOG_PREFIX}{dead}-{index:08d}"
        folder.mkdir()
        os.utime(folder, (now - index * 60,) * 2)
        folders.append(folder)
    ancient = folders[3]
    os.utime(ancient, (now - (worker.KEEP_LOG_DAYS + 1) * 86400,) * 2)
    live = owned_tempdir(tmp_path, worker.LOG_PREFIX)
    os.utime(live, (now - 10 * 86400 * worker.KEEP_LOG_DAYS,) * 2)
    worker.prune_logs(tmp_path)
    kept = {p.name for p in tmp_path.iterdir()}
    assert live.name in kept  # a running run's logs are never pruned
    assert ancient.name not in kept
    expected = [f for f in folders if f != ancient][: worker.KEEP_LOG_RUNS]
    assert kept == {f.name for f in expected} | {live.name}


def test_clean_run_removes_its_logs_and_a_failed_run_keeps_them(tmp_path):
    with worker.WorkerPool(1, tmp_path, timeout_s=60) as pool:
        assert pool.call("onnx", "parity.check.metrics:accuracy", logits=[[0.0, 1.0]], labels=[1]) == 1.0
        clean = pool.log_dir
    assert not clean.exists()
    with worker.WorkerPool(1, tmp_path, timeout_s=60) as pool:
        with pytest.raises(worker.TaskFailed, match="unknown path 'nope'") as caught:
            pool.call("onnx", "parity.run.paths:by_id", path_id="nope")
        assert caught.value.kind == "raised"
        failed = pool.log_dir
    assert (failed / "worker-onnx.log").is_file()
