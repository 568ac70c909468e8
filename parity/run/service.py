"""A per-user worker service: worker templates kept warm from one parity process to the next (Linux).

A template (``parity.run.processes.Template``) is a process that has imported one group's frameworks; every worker of
the group is forked from it. A pool keeps its templates as long as its process lives, so a pytest session pays
each import once; this service keeps them across processes, so a small ``parity check`` or a new pytest session
calling ``assert_parity`` forks its worker from a warm template in milliseconds instead of starting Python, NumPy
and a runtime again.

- **On demand**: the first pool that asks starts it (a detached ``python -m parity.run.service_main``) and goes on with
  its own work; it ends once no client has been connected and no worker of its has run for
  ``PARITY_WORKER_SERVICE_IDLE_S`` seconds (600). ``parity worker-service stop`` retires it at once.
- **Versioned**: its socket is named by a key over parity's version and sources, the interpreter, the installed
  packages (the modification times of the folders on ``sys.path``), the environment and the process's context
  (``context``); a client whose key differs starts its own, and services beyond the newest ``MAX_SERVICES`` retire.
  A template one of whose imported files changed since its import is replaced (its running workers finish first).
- **The client's sandbox and limits**: a worker inherits its template's namespaces, cgroup, resource limits, nice
  value, umask and CPU affinity, which are the service's, so the service serves only a client whose own are the
  same, as the kernel shows them (``/proc/<pid>`` of the ``SO_PEERCRED`` pid), checked at each fork; any other
  client forks from templates of its own, as with the service off.
- **Never waited on blindly**: every answer is bounded (a service busy starting a template says so every second); a
  silent service (stopped, hung) is given up, and so is one that ends: a worker lost with it is rerun by its pool.
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
import logging
import os
import resource
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
ANSWER_TIMEOUT_S = 5.0  # a client's wait for any message of the service's (an answer, or word that it works on one)
BUSY_EVERY_S = 1.0  # how often the service says it still works on a request
FORK_GRACE_S = 10.0  # a fork's answer: its template's import bound, and this
NAMESPACES = ("net", "mnt", "pid", "pid_for_children", "user", "ipc", "uts", "cgroup", "time", "time_for_children")
RLIMITS = sorted({getattr(resource, name) for name in dir(resource) if name.startswith("RLIMIT_")})

log = logging.getLogger(__name__)


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


def context(pid: int | str = "self") -> dict:
    """What a worker inherits from the process its template was started by, for process ``pid`` (this one by
    default) as the kernel shows it: namespaces, cgroups, resource limits, nice value, umask and CPU affinity.
    ``OSError`` where another process's cannot be read."""
    proc = Path("/proc") / str(pid)
    spaces: dict[str, str | None] = {}
    for name in NAMESPACES:
        try:
            spaces[name] = os.readlink(proc / "ns" / name)
        except FileNotFoundError:  # a kind of namespace this kernel does not have
            spaces[name] = None
    number = 0 if pid == "self" else int(pid)
    status = (proc / "status").read_text()
    umask = next((line.split()[1] for line in status.splitlines() if line.startswith("Umask:")), None)
    return {
        "namespaces": spaces,
        "cgroup": (proc / "cgroup").read_text(),
        "rlimits": [list(resource.prlimit(number, limit)) for limit in RLIMITS],
        "nice": os.getpriority(os.PRIO_PROCESS, number),
        "umask": umask,
        "affinity": sorted(os.sched_getaffinity(number)),
    }


def mismatch(theirs: dict, ours: dict) -> str | None:
    """How a client's context (``theirs``) differs from the service's (``ours``), in words; None where it does not."""
    for name in NAMESPACES:
        if theirs["namespaces"].get(name) != ours["namespaces"].get(name):
            return f"the client runs in another {name.replace('_for_children', '')} namespace"
    if theirs["cgroup"] != ours["cgroup"]:
        return "the client runs in another cgroup"
    for limit, a, b in zip(RLIMITS, theirs["rlimits"], ours["rlimits"]):
        if list(a) != list(b):
            names = [n for n in dir(resource) if n.startswith("RLIMIT_") and getattr(resource, n) == limit]
            return f"the client's {names[0] if names else limit} is {tuple(a)}, the service's {tuple(b)}"
    for name in ("nice", "umask", "affinity"):
        if theirs[name] != ours[name]:
            return f"the client's {name} is {theirs[name]}, the service's {ours[name]}"
    return None


def key() -> str:
    """What a template's imports depend on, hashed: parity's code, the interpreter, the installed packages,
    the environment (the calling shell's bookkeeping variables aside) and this process's context."""
    import parity

    package = Path(parity.__file__).parent
    sources = []
    for path in sorted(package.rglob("*.py")):  # sizes and times: a stat each, where a digest reads every file
        info = path.stat()
        sources.append((path.relative_to(package).as_posix(), info.st_size, info.st_mtime_ns))
    from parity.platform.packages import path_stamps

    environment = sorted((k, v) for k, v in os.environ.items() if k not in SHELL_VARIABLES)
    process = context()  # what a worker inherits from the service, not its client
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


def is_socket(path: Path) -> bool:
    """Whether ``path`` is a socket itself (not a link to one, nor a folder)."""
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except OSError:
        return False


def _connect(path: Path) -> socket.socket | None:
    if not is_socket(path):
        return None
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

    def request(self, message: dict, fd: int | None = None, within_s: float | None = None) -> dict:
        """The service's answer to ``message``: within ``within_s`` seconds where given, and in any case with no
        more than ``ANSWER_TIMEOUT_S`` of silence (a service at work on it says so); ``Unavailable`` otherwise, or
        where it refuses this client (every fork checks that the client's context is the service's)."""
        with self.lock:
            if self.closed:
                raise Unavailable("the worker service was given up")
            try:
                if self.sock is None:
                    self.sock = self._wait()
                answer = self._exchange(message, fd, within_s)
                if "refused" in answer:
                    raise Unavailable(f"the worker service does not serve this process: {answer['refused']}")
                return answer
            except (OSError, ValueError) as error:
                self.close()
                raise Unavailable(f"the worker service: {error or type(error).__name__}") from None
            except BaseException:  # an interrupt, a refusal: the answer may still come, so this connection is done
                self.close()
                raise

    def _exchange(self, message: dict, fd: int | None, within_s: float | None) -> dict:
        assert self.sock is not None
        deadline = None if within_s is None else time.monotonic() + within_s
        self.sock.settimeout(ANSWER_TIMEOUT_S)
        send(self.sock, message, fd)
        while True:
            try:
                answer, fds = receive(self.sock)
            except TimeoutError:
                raise Unavailable(f"the worker service said nothing for {ANSWER_TIMEOUT_S:g} s") from None
            for passed in fds:
                os.close(passed)
            if answer is None:
                raise Unavailable("the worker service ended")
            if not answer.get("busy"):
                return answer
            if deadline is not None and time.monotonic() > deadline:
                raise Unavailable(f"the worker service did not answer within {within_s:g} s")

    def _wait(self) -> socket.socket:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            sock = _connect(self.path)
            if sock is not None:
                if self.started is not None:
                    try:
                        self.started.wait(START_TIMEOUT_S)  # it forked the service and ended
                    except subprocess.TimeoutExpired:
                        pass
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
        # the service (or this template of its) ended: a worker that died then died with it, not of its task
        self.lost = False

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
                timeout_s + FORK_GRACE_S,
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
        """As ``Template.exit_code``; a worker whose service is gone is gone with it (``lost``)."""
        try:
            answer = self.client.request({"op": "status", "pid": pid, "wait": wait})
        except Unavailable:
            self.lost = True
            return -9
        if answer.get("lost"):
            self.lost = True
        return answer.get("exit")

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


def running(where: Path | None = None, besides: str | None = None, silent: bool = False) -> list[dict]:
    """What each of this user's services (but the one of key ``besides``) says of itself (``info``), stale sockets
    removed; ``silent``: a service that does not answer (stopped, hung) too, as ``{"key", "pid", "silent"}``.
    Only sockets count (not a link to one, nor a folder named like one)."""
    where = where or folder()
    found = []
    for path in sorted(where.glob("*.sock")):
        if path.stem == besides or not is_socket(path):
            continue
        answer = _control(path, {"op": "info"})
        if answer == {}:
            if is_socket(path):
                path.unlink(missing_ok=True)  # its service is gone: connecting is refused
        elif answer is not None:
            found.append(answer)
        elif silent:
            found.append({"key": path.stem, "pid": _listener(path), "silent": True})
    return found


def _listener(path: Path) -> int | None:
    """The pid of the process listening at ``path`` (as the kernel gives it), None where none is."""
    sock = _connect(path)
    if sock is None:
        return None
    with sock:
        return peer(sock)[0] or None


def peer(sock: socket.socket) -> tuple[int, int]:
    """The pid and uid of the process at the other end, as the kernel gives them (in this pid namespace)."""
    pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid, uid


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
    deadline = time.monotonic() + CONTROL_TIMEOUT_S
    with sock:
        try:
            send(sock, message)
            while time.monotonic() < deadline:  # a service busy past it (stuck under its lock) is not waited on
                answer, fds = receive(sock)
                for fd in fds:
                    os.close(fd)
                if answer is None or not answer.get("busy"):
                    return answer
        except (OSError, ValueError):
            pass
    return None


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
