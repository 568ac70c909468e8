"""A per-user worker service: worker templates kept warm from one parity process to the next (Linux).

A template (``parity.run.worker.Template``) is a process that has imported one group's frameworks; every worker of
the group is forked from it. A pool keeps its templates as long as its process lives, so a pytest session pays
each import once; this service keeps them across processes, so a small ``parity check`` or a new pytest session
calling ``assert_parity`` forks its worker from a warm template in milliseconds instead of starting Python, NumPy
and a runtime again.

- **On demand**: the first pool that asks starts it (a detached ``python -m parity.run.service_main``) and goes on with
  its own work; it ends once no client has been connected and no worker of its has run for
  ``PARITY_WORKER_SERVICE_IDLE_S`` seconds (600). ``parity worker-service stop`` retires it at once.
- **Versioned**: its socket is named by a key over parity's version and sources, the interpreter, the installed
  packages (the modification times of the folders on ``sys.path``) and the environment; a client whose key
  differs starts its own, and services beyond the newest ``MAX_SERVICES`` retire.
- **One user's**: its folder (``$XDG_RUNTIME_DIR/parity``, else ``/tmp/parity-<uid>``) is owned by the user and
  closed to others, checked before every use, and the service refuses a client of another uid (``SO_PEERCRED``).
- **Isolation kept**: a worker is a child of its template, not of its client, so it watches its client's pid and
  ends with it; the client's end of the worker's pipe is passed to it as a descriptor, so tasks and results never
  go through the service. The service's own messages are length-prefixed JSON; nothing read from its socket is
  unpickled.
- **Bounded**: at most ``MAX_TEMPLATES`` templates; the least recently used one with no running worker ends first.
- **Off** with ``PARITY_WORKER_SERVICE=off`` (the test suite), in timed runs (their workers are the timing audit's
  own processes), on Ray nodes, and where workers do not fork.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

from parity.platform.errors import TaskFailed

VARIABLE = "PARITY_WORKER_SERVICE"
IDLE_VARIABLE = "PARITY_WORKER_SERVICE_IDLE_S"
IDLE_S = 600.0
MAX_TEMPLATES = 3  # a torch or TensorFlow template holds about 1 GB
MAX_SERVICES = 2  # a user's services, each of its own key (another interpreter, environment or parity version)
START_TIMEOUT_S = 10.0  # a new service's socket must answer within this
MAX_MESSAGE = 1 << 20
# variables of the calling shell (or test runner) that no import depends on: not part of the key
SHELL_VARIABLES = frozenset(
    {"PWD", "OLDPWD", "SHLVL", "_", "PYTEST_CURRENT_TEST", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_TESTRUNUID"}
)
STALE_FILES_S = 86400.0  # logs and locks of services long gone are removed after this
CONTROL_TIMEOUT_S = 2.0  # an answer to info or retire


class Unavailable(Exception):
    """The service cannot be reached (or started); the pool forks from templates of its own instead."""


def enabled() -> bool:
    """Whether pools that may use the service use it: on Linux, unless ``PARITY_WORKER_SERVICE=off``."""
    return sys.platform.startswith("linux") and os.environ.get(VARIABLE, "on").lower() not in ("off", "0", "no")


def folder() -> Path:
    """The user's service folder, created if missing; ``Unavailable`` where it is not the user's alone."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    path = Path(runtime) / "parity" if runtime else Path("/tmp") / f"parity-{os.getuid()}"
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(path)
    except OSError as error:
        raise Unavailable(f"{path}: {error.strerror or error}") from None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise Unavailable(f"{path} is not a folder of this user's alone (mode {stat.filemode(info.st_mode)})")
    return path


def key() -> str:
    """What a template's imports depend on, hashed: parity's code, the interpreter, the installed packages and
    the environment (the calling shell's bookkeeping variables aside)."""
    import parity

    package = Path(parity.__file__).parent
    sources = []
    for path in sorted(package.rglob("*.py")):  # sizes and times: a stat each, where a digest reads every file
        info = path.stat()
        sources.append((path.relative_to(package).as_posix(), info.st_size, info.st_mtime_ns))
    from parity.platform.packages import path_stamps

    environment = sorted((k, v) for k, v in os.environ.items() if k not in SHELL_VARIABLES)
    mask = os.umask(0o022)
    os.umask(mask)
    process = [sorted(os.sched_getaffinity(0)), mask]  # what a worker inherits from the service, not its client
    text = json.dumps(
        [parity.__version__, str(package), sources, sys.executable, sys.version, path_stamps(), environment, process]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def send(sock: socket.socket, message: dict, fd: int | None = None) -> None:
    """One message: its length (4 bytes), then its JSON; ``fd`` passed with the first byte."""
    data = json.dumps(message).encode()
    frame = struct.pack("!I", len(data)) + data
    if fd is not None:
        socket.send_fds(sock, [frame[:1]], [fd])
        frame = frame[1:]
    sock.sendall(frame)


def receive(sock: socket.socket) -> tuple[dict | None, list[int]]:
    """One message and the descriptors passed with it; None at the end of the stream."""
    head, fds = b"", []
    while len(head) < 4:
        chunk, passed, _, _ = socket.recv_fds(sock, 4 - len(head), 4)
        fds += passed
        if not chunk:
            for fd in fds:
                os.close(fd)
            return None, []
        head += chunk
    try:
        (size,) = struct.unpack("!I", head)
        if size > MAX_MESSAGE:
            raise ValueError(f"a message of {size} bytes")
        body = b""
        while len(body) < size:
            chunk = sock.recv(size - len(body))
            if not chunk:
                raise ConnectionError("the stream ended inside a message")
            body += chunk
        try:
            message = json.loads(body)
        except RecursionError:
            raise ValueError("a message nested too deeply") from None
        if not isinstance(message, dict):
            raise ValueError("a message that is not a JSON object")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return message, fds


def _connect(path: Path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        return None
    return sock


class Client:
    """A pool's connection to the service; opened without waiting (a service started now answers at its first
    request)."""

    def __init__(self, threads: int, env: dict):
        self.threads, self.env = threads, env
        self.folder = folder()
        self.lock = threading.Lock()
        self.started: subprocess.Popen | None = None
        self.closed = False
        try:
            self.key = key()
            self.path = self.folder / f"{self.key}.sock"
            self.sock = _connect(self.path)
            if self.sock is None:
                self.started = start(self.folder, self.key, threads, env)
        except OSError as error:  # a source file gone while it was listed, a log that cannot be opened
            raise Unavailable(f"the worker service: {error}") from None

    def request(self, message: dict, fd: int | None = None) -> dict:
        with self.lock:
            if self.closed:
                raise Unavailable("the worker service was given up")
            try:
                if self.sock is None:
                    self.sock = self._wait()
                send(self.sock, message, fd)
                answer, fds = receive(self.sock)
            except (OSError, ValueError) as error:
                self.close()
                raise Unavailable(f"the worker service: {error}") from None
            except BaseException:  # an interrupt: the answer may still come, so this connection is done
                self.close()
                raise
            for passed in fds:
                os.close(passed)
            if answer is None:
                self.close()
                raise Unavailable("the worker service ended")
            return answer

    def _wait(self) -> socket.socket:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            sock = _connect(self.path)
            if sock is not None:
                if self.started is not None:
                    self.started.wait()  # it forked the service and ended
                return sock
            if self.started is not None and self.started.poll() not in (None, 0):  # it could not start
                raise Unavailable(f"it did not start; see {self.folder / self.key}.log")
            time.sleep(0.005)
        raise Unavailable(f"no answer within {START_TIMEOUT_S:g} s; see {self.folder / self.key}.log")

    def template(self, group: str) -> RemoteTemplate:
        return RemoteTemplate(self, group)

    @property
    def alive(self) -> bool:
        return not self.closed

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock, self.started, self.closed = None, None, True


class RemoteTemplate:
    """The service's template of one group, used as a pool uses a ``Template`` of its own."""

    def __init__(self, client: Client, group: str):
        self.client, self.group, self.in_use = client, group, 0

    @property
    def alive(self) -> bool:
        return self.client.alive

    def fork(self, log_path: Path, timeout_s: float):
        """A new worker forked by the service: its pid and this process's end of its pipe (``Unavailable``
        where the service cannot be reached, ``TaskFailed`` where the template could not fork one)."""
        import multiprocessing

        ours, theirs = multiprocessing.Pipe()
        try:
            answer = self.client.request(
                {
                    "op": "fork",
                    "group": self.group,
                    "threads": self.client.threads,
                    "env": self.client.env,
                    "log": str(log_path),
                    "cwd": os.getcwd(),
                    "sys_path": list(sys.path),
                    "client": os.getpid(),
                    "timeout_s": timeout_s,
                },
                theirs.fileno(),
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        if "error" in answer:
            ours.close()
            raise TaskFailed(str(answer["error"]), str(answer.get("kind", "died")))
        return int(answer["pid"]), ours

    def exit_code(self, pid: int, wait: bool = False) -> int | None:
        """As ``Template.exit_code``; a worker whose service is gone is gone with it."""
        try:
            return self.client.request({"op": "status", "pid": pid, "wait": wait}).get("exit")
        except Unavailable:
            return -9

    def close(self) -> None:
        """Nothing: the template is the service's."""


def start(where: Path, name: str, threads: int, env: dict) -> subprocess.Popen:
    """A detached service for key ``name``, in its own session (a client's end does not end it), its output to
    ``<name>.log``; it starts a spare template for ``threads`` and ``env`` at once."""
    import parity

    package = Path(parity.__file__).parent
    with open(where / f"{name}.log", "wb") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "parity.run.service_main",
                *(str(where), name, str(threads), json.dumps(env), str(package)),
            ],
            cwd=package.parent,  # first on its path: the parity this client runs, wherever that is
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )


def running(where: Path | None = None, besides: str | None = None) -> list[dict]:
    """What each of this user's services (but the one of key ``besides``) says of itself (``info``), stale sockets
    removed."""
    where = where or folder()
    found = []
    for path in sorted(where.glob("*.sock")):
        if path.stem == besides:
            continue
        answer = _control(path, {"op": "info"})
        if answer == {}:
            path.unlink(missing_ok=True)  # its service is gone: connecting is refused
        elif answer is not None:
            found.append(answer)
    return found


def retire(names: list[str], where: Path | None = None) -> list[str]:
    """Ask the services of ``names`` (keys) to end once their clients have left; the keys asked."""
    where = where or folder()
    asked = []
    for name in names:
        if _control(where / f"{name}.sock", {"op": "retire"}):
            asked.append(name)
    return asked


def _control(path: Path, message: dict) -> dict | None:
    """A service's answer to one control message; {} where nothing listens at ``path``, None where the service
    does not answer in time (busy starting, or hung)."""
    sock = _connect(path)
    if sock is None:
        return {}
    sock.settimeout(CONTROL_TIMEOUT_S)
    with sock:
        try:
            send(sock, message)
            answer, fds = receive(sock)
        except (OSError, ValueError):
            return None
    for fd in fds:
        os.close(fd)
    return answer


def prune(where: Path, live: set[str]) -> None:
    """Remove the logs and locks of services whose key is not in ``live`` and that have not run for a day."""
    cutoff = time.time() - STALE_FILES_S
    for path in where.iterdir():
        if path.suffix in (".log", ".lock") and path.name.split(".")[0].split("-")[0] not in live:
            try:
                if path.stat().st_mtime < cutoff:
                    path.unlink()
            except OSError:
                pass
