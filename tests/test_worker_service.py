"""The worker service: templates kept warm from one process to the next, one user's, versioned, ended when idle,
and a worker that still ends with the process that asked for it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from parity.cli import cli
from parity.run import service
from parity.run.worker import WorkerPool

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers fork from templates on Linux")

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def service_dir(monkeypatch):
    """A private runtime folder (short: a socket's path has at most 107 bytes) with the service on; every service
    started in it retired at the end."""
    root = Path(tempfile.mkdtemp(prefix="pws-", dir="/tmp"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(root))
    monkeypatch.setenv(service.VARIABLE, "on")
    monkeypatch.setenv(service.IDLE_VARIABLE, "60")
    yield root / "parity"
    if (root / "parity").is_dir():
        service.retire([p.stem for p in (root / "parity").glob("*.sock")], root / "parity")
        until(lambda: not list((root / "parity").glob("*.sock")), 20)
    shutil.rmtree(root, ignore_errors=True)


def until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_second_pool_forks_from_the_template_the_first_one_warmed(service_dir, tmp_path):
    with WorkerPool(1, tmp_path, 120, service=True) as pool:
        assert pool.call("onnx", "parity.check.metrics:accuracy", logits=[[0.0, 1.0]], labels=[1]) == 1.0
        first, template = pool.call("onnx", "os:getpid"), pool.call("onnx", "os:getppid")
        assert pool.call("onnx", "parity.run.worker:process_origin").startswith("forked")
    with WorkerPool(1, tmp_path, 120, service=True) as pool:
        second, again = pool.call("onnx", "os:getpid"), pool.call("onnx", "os:getppid")
    assert second != first and again == template  # a new worker of the same warm template
    ours = {p.pid for p in psutil.Process().children(recursive=True)}
    assert template not in ours  # the service's, not this process's
    (info,) = service.running(service_dir)
    assert info["templates"] == ["onnx"] and info["clients"] == 0 and not info["retiring"]
    assert os.stat(service_dir).st_mode & 0o777 == 0o700
    assert os.stat(service_dir / f"{info['key']}.sock").st_mode & 0o777 == 0o600


def test_a_template_started_for_one_client_outlives_it(service_dir, tmp_path):
    with WorkerPool(1, tmp_path, 120, service=True) as pool:  # the spare, started with the service, becomes onnx
        pool.call("onnx", "os:getpid")
    with WorkerPool(2, tmp_path, 120, service=True) as pool:  # two threads: a template of its own, started now
        template = pool.call("onnx", "os:getppid")
    time.sleep(0.5)  # the client's connection, and the service's thread that served it, have ended
    with WorkerPool(2, tmp_path, 120, service=True) as pool:
        assert pool.call("onnx", "os:getppid") == template
    (info,) = service.running(service_dir)
    assert info["templates"] == ["onnx", "onnx"]


def test_a_worker_ends_with_the_process_that_asked_for_it(service_dir, tmp_path):
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        sys.path.insert(0, {str(REPO)!r})
        from parity.run.worker import WorkerPool
        pool = WorkerPool(1, Path({str(tmp_path)!r}), 120, service=True)
        print(pool.call("onnx", "os:getpid"), flush=True)
        time.sleep(120)
    """)
    client = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(client.stdout.readline())
        assert not gone(worker)
    finally:
        client.kill()
        client.wait()
    assert until(lambda: gone(worker), 10)  # killed with its client, though the service's template is its parent
    assert service.running(service_dir)  # the service itself serves on


def test_the_key_follows_what_imports_depend_on_not_the_shell(service_dir, monkeypatch):
    before = service.key()
    monkeypatch.setenv("PWD", "/somewhere/else")
    monkeypatch.setenv("SHLVL", "7")
    assert service.key() == before
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert service.key() != before


def test_a_folder_others_can_enter_is_refused_and_the_pool_forks_its_own(service_dir, tmp_path):
    service_dir.mkdir(mode=0o755)
    os.chmod(service_dir, 0o755)
    with pytest.raises(service.Unavailable, match="not a folder of this user's alone"):
        service.folder()
    with WorkerPool(1, tmp_path, 120, service=True) as pool:
        template = pool.call("onnx", "os:getppid")
        assert pool.service is None
        assert template in {p.pid for p in psutil.Process().children(recursive=True)}
    assert not list(service_dir.iterdir())


def test_an_idle_service_ends_and_removes_its_socket(service_dir, tmp_path, monkeypatch):
    monkeypatch.setenv(service.IDLE_VARIABLE, "0.5")
    with WorkerPool(1, tmp_path, 120, service=True) as pool:
        pool.call("onnx", "os:getpid")
        (info,) = service.running(service_dir)
    assert until(lambda: gone(info["pid"]), 15)
    assert not list(service_dir.glob("*.sock"))


def test_a_malformed_request_ends_that_connection_only_and_stop_retires(service_dir, tmp_path):
    with WorkerPool(1, tmp_path, 120, service=True) as pool:
        pool.call("onnx", "os:getpid")
    (info,) = service.running(service_dir)
    for junk in (b"\x00\x00\x00\x05hello", b"\xff\xff\xff\xff", b"\x00\x00\x00\x02[]"):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(service_dir / f"{info['key']}.sock"))
            sock.sendall(junk)
            sock.settimeout(10)
            assert sock.recv(1 << 16) == b""  # the service hangs up on it
    assert [s["pid"] for s in service.running(service_dir)] == [info["pid"]]
    shown = CliRunner().invoke(cli, ["worker-service"])
    assert shown.exit_code == 0 and f"pid {info['pid']}" in shown.output and "templates onnx" in shown.output
    stopped = CliRunner().invoke(cli, ["worker-service", "--stop"])
    assert stopped.exit_code == 0 and "retired 1 worker service" in stopped.output
    assert until(lambda: gone(info["pid"]), 15)


def test_a_service_that_cannot_start_is_said_at_once_and_the_pool_forks_its_own(service_dir, tmp_path):
    service_dir.mkdir(mode=0o700)
    (service_dir / f"{service.key()}.lock").mkdir()  # its lock cannot be taken: the service ends before it listens
    started = time.monotonic()
    with WorkerPool(1, tmp_path, 120, service=True) as pool:
        template = pool.call("onnx", "os:getppid")
        assert pool.service is None  # given up, not waited for
        assert template in {p.pid for p in psutil.Process().children(recursive=True)}
    assert time.monotonic() - started < service.START_TIMEOUT_S
    assert "Error" in (service_dir / f"{service.key()}.log").read_text()  # the reason, in its log


def test_a_folder_on_sys_path_counts_by_its_time_only_where_packages_are_installed(tmp_path, monkeypatch):
    from parity.platform.packages import path_stamps

    source, site = tmp_path / "src", tmp_path / "site"
    source.mkdir()
    (site / "pkg-1.0.dist-info").mkdir(parents=True)
    os.utime(site, ns=(10**18, 10**18))
    monkeypatch.setattr(sys, "path", [str(source), str(site)])
    before = service.key()
    assert path_stamps() == [[str(source), None], [str(site), 10**18]]
    (source / "notes.txt").write_text("a file written beside a script changes nothing")
    assert service.key() == before
    (site / "pkg-1.0.dist-info").rename(site / "pkg-2.0.dist-info")  # an upgrade
    assert service.key() != before
