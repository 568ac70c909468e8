"""Owned scratch folders, the sweep of what killed runs left, atomic directory replacement."""

from __future__ import annotations

import os
import threading
import time

import pytest

from parity.platform import safefs
from parity.platform.errors import UsageError
from tests.conftest import dead_owner_tag


def test_sweep_removes_folders_of_dead_owners_only(tmp_path):
    mine = safefs.owned_tempdir(tmp_path, ".mlp.build-")
    dead = tmp_path / f".mlp.build-{dead_owner_tag()}-abcdefgh"
    dead.mkdir()
    (dead / "weights.npz").write_bytes(b"half")
    legacy_old = tmp_path / ".mlp.staging-zz_8f2k1"
    legacy_old.mkdir()
    os.utime(legacy_old, (time.time() - 2 * safefs.LEGACY_STALE_S,) * 2)
    legacy_new = tmp_path / ".mlp.staging-yy_8f2k1"
    legacy_new.mkdir()
    unrelated = tmp_path / "mlp"
    unrelated.mkdir()
    removed = safefs.sweep(tmp_path, r"^\.[^/]+\.(build|staging|old)-")
    assert sorted(removed) == sorted([dead, legacy_old])
    assert mine.exists() and legacy_new.exists() and unrelated.exists()
    assert safefs.owner_alive(mine.name) is True and safefs.owner_alive(dead.name) is False


def test_replace_dir_never_leaves_the_target_missing(tmp_path):
    target = tmp_path / "mlp"
    target.mkdir()
    (target / "version").write_text("0")
    missing = []
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            if not (target / "version").exists():
                missing.append(time.perf_counter())

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for version in range(1, 50):
            new = safefs.owned_tempdir(tmp_path, ".mlp.build-")
            (new / "version").write_text(str(version))
            safefs.replace_dir(new, target)
            assert (new / "version").read_text() == str(version - 1)  # the old folder, for the caller to remove
            safefs.shutil.rmtree(new)
    finally:
        stop.set()
        thread.join()
    assert not missing
    assert (target / "version").read_text() == "49"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp"]


def test_replace_dir_into_a_new_place(tmp_path):
    new = safefs.owned_tempdir(tmp_path, ".x.build-")
    (new / "a").write_text("a")
    safefs.replace_dir(new, tmp_path / "x")
    assert (tmp_path / "x" / "a").read_text() == "a" and not new.exists()


def test_check_writable(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UsageError, match="--json .* cannot be written"):
        safefs.check_writable(blocker / "r.json", "--json")
    with pytest.raises(UsageError, match="is a folder"):
        safefs.check_writable(tmp_path, "--json")
    assert safefs.check_writable(tmp_path / "new" / "r.json", "--json").parent.is_dir()
    assert [p.name for p in (tmp_path / "new").iterdir()] == []  # the probe file is gone
