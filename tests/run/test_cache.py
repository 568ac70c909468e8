"""The export cache: damaged entries are rebuilt, converter errors are cached, concurrent runs export once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from parity.model.workspace import Workspace
from parity.pipeline import orchestrate
from parity.run.cache import ExportCache


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("PARITY_CACHE_DIR", str(cache))
    return cache


def run_check(root, path_id, **options):
    notices = []
    report = orchestrate.check(
        Workspace(root),
        ["mlp"],
        orchestrate.Options(threads=1, patterns=(path_id,), **options),
        progress=notices.append,
    )
    return report["results"][0], notices


def test_truncated_export_is_detected_discarded_and_rebuilt(workspace_copy, private_cache):
    """A truncated model.onnx in a finished entry was once reused forever (InvalidProtobuf on every run)."""
    root = workspace_copy()
    first, _ = run_check(root, "torch/onnx/ort")
    assert first["verdict"] == "pass" and first["export"]["cached"] is False
    [model_file] = (private_cache / "exports").glob("*/model.onnx")
    model_file.write_bytes(model_file.read_bytes()[:1000])
    second, notices = run_check(root, "torch/onnx/ort")
    assert second["verdict"] == "pass", second["reason"]
    assert second["export"]["cached"] is False
    assert any("is damaged (model.onnx sha256 mismatch); exporting again" in n for n in notices), notices
    third, notices = run_check(root, "torch/onnx/ort")
    assert third["export"]["cached"] is True and not any("damaged" in n for n in notices)


def test_commit_replaces_an_entry_without_deleting_it_first(tmp_path):
    cache = ExportCache(tmp_path)
    for content in ("old", "new"):
        staging = cache.staging_dir()
        (staging / "model.onnx").write_text(content)
        entry = cache.commit("k", staging, {"format": "onnx"})
        assert not staging.exists()
    assert (entry.dir / "model.onnx").read_text() == "new"
    assert cache.lookup("k").meta == {"format": "onnx"}
    error = cache.commit_error("e", "tf2onnx could not convert op(s) Erfc")
    assert cache.lookup("e").error == error.error and not list((tmp_path / "exports").glob(".staging-*"))


def test_converter_error_is_cached(workspace_copy, private_cache):
    """An expected converter failure is not redone on every run."""
    from tests.conftest import mlp_variant

    source = mlp_variant(
        {'h = layers.ReLU(name="relu1", dtype=dtype)(': 'h = layers.Activation("gelu", name="relu1", dtype=dtype)('}
    )
    root = workspace_copy(source)
    first, _ = run_check(root, "tf/onnx/ort")
    second, notices = run_check(root, "tf/onnx/ort")
    assert first["verdict"] == second["verdict"] == "error"
    assert second["reason"] == first["reason"] and "Erfc" in second["reason"]
    assert first["export"]["cached"] is False and second["export"]["cached"] is True
    assert not any("export" in n for n in notices)
    again, _ = run_check(root, "tf/onnx/ort", use_cache=False)
    assert again["export"]["cached"] is False and "Erfc" in again["reason"]


def test_concurrent_runs_sharing_a_cache_export_once(workspace_copy, private_cache, tmp_path):
    root = workspace_copy()
    command = [
        sys.executable,
        "-m",
        "parity.cli",
        "check",
        "--workspace",
        str(root),
        "--path",
        "torch/onnx/ort",
        "--threads",
        "1",
        "--json",
    ]
    env = {**os.environ, "PARITY_CACHE_DIR": str(private_cache)}
    results = [tmp_path / f"r{i}.json" for i in range(2)]
    runs = [
        subprocess.Popen([*command, str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for out in results
    ]
    outputs = [run.communicate(timeout=600) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    exported = [json.loads(out.read_text())["results"][0]["export"]["cached"] for out in results]
    assert sorted(exported) == [False, True], outputs  # one run exported, the other found it in the cache
    assert len(list((private_cache / "exports").glob("*/meta.json"))) == 1


def _entry(cache: ExportCache, key: str, nbytes: int, used_s_ago: float) -> None:
    staging = cache.staging_dir()
    (staging / "model.onnx").write_bytes(b"x" * nbytes)
    cache.commit(key, staging, {"file": "model.onnx"})
    used = time.time() - used_s_ago
    os.utime(cache.exports / key / "meta.json", (used, used))


def test_the_cache_keeps_its_bound_by_removing_the_least_recently_used_entries_no_run_holds(tmp_path):
    cache = ExportCache(tmp_path)
    for key, ago in [("old", 9000), ("older", 9500), ("oldest", 9900), ("recent", 10)]:
        _entry(cache, key, 1000, ago)
    assert cache.lookup("oldest") is not None  # a lookup marks the entry used: now the most recent
    with cache.lock("older", timeout_s=0):  # another run holds it
        removed = cache.prune(max_bytes=2500, keep_used_s=3600)
    assert [p.name for p in removed] == ["old"]  # still over: "older" is locked, the other two used within the hour
    assert sorted(p.name for p in cache.exports.iterdir() if p.is_dir()) == ["older", "oldest", "recent"]
    # used within the hour: kept whatever the bound (a run may be reading it)
    assert [p.name for p in cache.prune(max_bytes=1, keep_used_s=3600)] == ["older"]
    assert cache.prune(max_bytes=0) == []  # 0: no bound


def test_generation_exports_count_in_the_bound_and_the_oldest_of_both_kinds_goes_first(tmp_path, monkeypatch):
    from parity.pipeline import generation
    from parity.platform.cache_dir import cache_root, named_lock

    monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path))
    cache = ExportCache(cache_root())
    _entry(cache, "export", 1000, 9000)
    for key, ago in [("decoder_old", 9900), ("decoder_held", 9800), ("decoder_new", 10)]:
        entry = cache_root() / generation.EXPORTS / key
        entry.mkdir(parents=True)
        (entry / "model.onnx").write_bytes(b"x" * 1000)
        (entry / generation.META).write_text("{}")
        used = time.time() - ago
        os.utime(entry / generation.META, (used, used))
    with named_lock("generation-export-decoder_held", 0):  # another run is exporting or reading it
        removed = cache.prune(max_bytes=1500, keep_used_s=3600, also=(generation.export_kind(),))
    assert [p.name for p in removed] == ["decoder_old", "export"]  # the least recently used first, of either kind
    assert sorted(p.name for p in (cache_root() / generation.EXPORTS).iterdir()) == ["decoder_held", "decoder_new"]


def test_the_cache_bound_comes_from_its_variable_and_a_bad_value_is_one_line(monkeypatch):
    from parity.platform.errors import UsageError
    from parity.run import cache as cache_module

    monkeypatch.delenv("PARITY_CACHE_MAX_BYTES", raising=False)
    assert cache_module.max_bytes_allowed() == 20 << 30
    monkeypatch.setenv("PARITY_CACHE_MAX_BYTES", "50G")
    assert cache_module.max_bytes_allowed() == 50 * 10**9
    monkeypatch.setenv("PARITY_CACHE_MAX_BYTES", "0")
    assert cache_module.max_bytes_allowed() == 0
    monkeypatch.setenv("PARITY_CACHE_MAX_BYTES", "lots")
    with pytest.raises(UsageError, match="PARITY_CACHE_MAX_BYTES='lots'"):
        cache_module.max_bytes_allowed()
