"""The worker service's process (``python -m parity.run.service_main``, started by ``parity.run.service.start``):
one thread per client, the templates shared under one lock; see ``parity.run.service``."""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import signal
import socketserver
import threading
import time
import traceback
from pathlib import Path

from parity.platform.errors import TaskFailed
from parity.run.processes import Template, environment_key
from parity.run.service import (
    BUSY_EVERY_S,
    IDLE_S,
    IDLE_VARIABLE,
    MAX_SERVICES,
    MAX_TEMPLATES,
    context,
    mismatch,
    peer,
    prune,
    receive,
    retire,
    running,
    send,
)

MAX_ENDED = 1024  # exit codes kept for clients that may still ask


class Service(socketserver.ThreadingUnixStreamServer):
    """The server: one thread per client connection, the templates shared under one lock."""

    daemon_threads = True

    def __init__(self, where: Path, name: str, idle_s: float, threads: int, env: dict):
        self.where, self.name, self.idle_s = where, name, idle_s
        self.state = threading.Lock()
        self.templates: dict[
            tuple, Template
        ] = {}  # (group, *worker.environment_key) -> template, least recently used first
        self.owner: dict[int, Template] = {}  # pid of a worker not yet known to have ended -> its template
        # exit codes of workers that ended, until their client asks, and whether their template had ended too
        self.ended: dict[int, tuple[int, bool]] = {}
        self.retired: list[Template] = []  # templates replaced (an imported file changed), ended once idle
        self.clients, self.last_active, self.retiring = 0, time.monotonic(), False
        self.retire_now = threading.Event()  # set with ``retiring``: the idle watch ends the service at once
        # every template starts on this one thread, alive as long as the service: a template's parent-death signal
        # follows the thread that started it, so one started on a client's thread would end with that client
        self.spawner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="template-start")
        self.spare: Template | None = self._new(None, threads, where / f"{name}-spare.log", env)
        self.spare_key = environment_key(threads, env)
        path = where / f"{name}.sock"
        path.unlink(missing_ok=True)
        super().__init__(str(path), Handler)
        os.chmod(path, 0o600)
        self.inode = os.stat(path).st_ino  # at the end, the socket file is removed only while it is still ours

    def _new(self, group: str | None, threads: int, log: Path, env: dict) -> Template:
        return self.spawner.submit(Template, group, threads, log, env).result()

    def verify_request(self, request, client_address) -> bool:
        return peer(request)[1] == os.getuid()

    def refusal(self, client: int) -> str | None:
        """Why the client of pid ``client`` is not served here: a worker forked here would run outside its
        namespaces, cgroup or limits (see ``parity.run.service.context``); None where it is served."""
        try:
            if client <= 0:
                return "its pid is not known in the service's pid namespace"
            if int(os.readlink("/proc/self")) != os.getpid():
                return "the service's /proc is another pid namespace's"
            theirs = context(client)
        except (OSError, ValueError) as error:
            return f"its process cannot be read: {error}"
        return mismatch(theirs, context())

    def fork(self, message: dict, fd: int, client: int) -> dict:
        """A worker for the client of pid ``client`` (as the kernel gives it, never as the message says)."""
        reason = self.refusal(client)
        if reason is not None:
            return {"refused": reason}
        group, threads, env = str(message["group"]), int(message["threads"]), dict(message["env"])
        template = self._template(group, threads, env)
        try:
            pid = template.fork_onto(
                fd,
                str(message["log"]),
                str(message["cwd"]),
                list(message["sys_path"]),
                client,
                float(message["timeout_s"]),
            )
        except TaskFailed as error:
            return {"error": str(error), "kind": error.kind}
        with self.state:
            self.owner[pid] = template
        if template.imported is None:  # its import is done now: what it imported, as it was then
            try:
                template.imported = template.imports()
            except (TaskFailed, EOFError, OSError):
                template.imported = {}
        return {"pid": pid}

    def _template(self, group: str, threads: int, env: dict) -> Template:
        slot = (group, *environment_key(threads, env))  # as a pool keys its own templates
        busy = {id(t) for t in self._running().values()}
        with self.state:
            template = self.templates.pop(slot, None)
            if template is not None and template.alive and changed(template.imported or {}):
                self.retired.append(template)  # its running workers finish; a new one imports the files as they are
                template = None
            if template is None or not template.alive:
                if template is not None:
                    template.close()
                spare, self.spare = self.spare, None
                if spare is not None and spare.alive and self.spare_key == slot[1:]:
                    spare.adopt(group, self.where / f"{self.name}-{group}.log")
                    template = spare
                else:
                    if spare is not None:
                        spare.close()
                    template = self._new(group, threads, self.where / f"{self.name}-{group}.log", env)
            self.templates[slot] = template
            for old in [s for s, t in self.templates.items() if s != slot and id(t) not in busy]:
                if len(self.templates) <= MAX_TEMPLATES:
                    break
                self.templates.pop(old).close()
            return template

    def _running(self) -> dict[int, Template]:
        """The workers forked here that still run; the exit codes of those that ended are kept for their clients.
        The templates are asked outside ``state``: one may be busy importing its frameworks for another client."""
        with self.state:
            owned = dict(self.owner)
        for pid, template in owned.items():
            code = template.exit_code(pid)
            if code is not None:
                with self.state:
                    self.owner.pop(pid, None)
                    self.ended[pid] = (code, not template.alive)
                    while len(self.ended) > MAX_ENDED:  # codes no client asked for (it was killed)
                        self.ended.pop(next(iter(self.ended)))
        with self.state:
            owners = {id(t) for t in self.owner.values()}
            idle = [t for t in self.retired if id(t) not in owners]
            self.retired = [t for t in self.retired if id(t) in owners]
            running = dict(self.owner)
        for template in idle:
            template.close()
        return running

    def status(self, message: dict) -> dict:
        pid = int(message["pid"])
        with self.state:
            if pid in self.ended:
                ended, lost = self.ended.pop(pid)
                return {"exit": ended, "lost": lost}
            template = self.owner.get(pid)
        if template is None:  # not a worker of this service's: never one to wait for, nor to kill
            return {"exit": -signal.SIGKILL}
        code = template.exit_code(pid, bool(message.get("wait")))
        if code is not None:
            with self.state:
                self.owner.pop(pid, None)
        # a worker dies with its template: one that ended while its template did was lost with it
        return {"exit": code, "lost": code is not None and not template.alive}

    def info(self) -> dict:
        workers = len(self._running())
        with self.state:
            return {
                "pid": os.getpid(),
                "key": self.name,
                "clients": self.clients - 1,  # the one asking aside
                "idle_s": round(time.monotonic() - self.last_active, 1),
                "templates": [slot[0] for slot in self.templates],
                "workers": workers,
                "retiring": self.retiring,
            }

    def idle(self) -> bool:
        workers = self._running()
        with self.state:
            if self.clients or workers:
                self.last_active = time.monotonic()
                return False
            return self.retiring or time.monotonic() - self.last_active > self.idle_s

    def end(self) -> None:
        with self.state:
            for template in [*self.templates.values(), *self.retired, *([self.spare] if self.spare else [])]:
                template.close()
            self.templates.clear()
            self.retired.clear()
        self.spawner.shutdown(wait=False)
        path = self.where / f"{self.name}.sock"
        try:
            if os.stat(path).st_ino == self.inode:
                path.unlink()
        except OSError:
            pass
        self.server_close()


def changed(imported: dict) -> bool:
    """Whether a file a template imported (``path -> [size, mtime_ns]``) changed, or is gone, since."""
    for path, (size, mtime_ns) in imported.items():
        try:
            info = os.stat(path)
        except OSError:
            return True
        if info.st_size != size or info.st_mtime_ns != mtime_ns:
            return True
    return False


class Handler(socketserver.BaseRequestHandler):
    """One client: its requests, in order, until it closes its end."""

    server: Service

    def handle(self) -> None:
        service = self.server
        with service.state:
            service.clients += 1
        try:
            while True:
                try:
                    message, fds = receive(self.request)
                except (OSError, ValueError):
                    return
                if message is None:
                    return
                try:
                    send(self.request, self._busy(service, message, fds, peer(self.request)[0]))
                finally:
                    for fd in fds:
                        os.close(fd)
        finally:
            with service.state:
                service.clients -= 1
                service.last_active = time.monotonic()

    def _busy(self, service: Service, message: dict, fds: list[int], client: int) -> dict:
        """The answer to one request, worked out on a thread of its own while this one says every
        ``BUSY_EVERY_S`` that the service is at work on it (starting a template takes seconds), so the client
        tells a busy service from a silent one."""
        answer: list[dict] = []

        def work() -> None:
            try:
                answer.append(self._answer(service, message, fds, client))
            except Exception as error:  # noqa: BLE001 - a malformed request is that client's error, not ours
                answer.append({"error": f"{type(error).__name__}: {error}", "kind": "died"})

        thread = threading.Thread(target=work, name="request", daemon=True)
        thread.start()
        thread.join(BUSY_EVERY_S)
        while thread.is_alive():
            try:
                send(self.request, {"busy": True})
            except OSError:
                thread.join()  # the client left; the passed descriptor is closed only once the work is done
                raise
            thread.join(BUSY_EVERY_S)
        return answer[0]

    @staticmethod
    def _answer(service: Service, message: dict, fds: list[int], client: int) -> dict:
        op = message.get("op")
        if op == "fork":
            if len(fds) != 1:
                raise ValueError("a fork request without its descriptor")
            return service.fork(message, fds[0], client)
        if op == "status":
            return service.status(message)
        if op == "info":
            return service.info()
        if op == "retire":
            service.retiring = True
            service.retire_now.set()
            return {"retiring": True}
        raise ValueError(f"unknown request {op!r}")


def serve(where: Path, name: str, threads: int, env: dict, ready: int) -> None:
    """Run the service of key ``name`` until it is idle; only one per key (a file lock held while it runs). A byte
    on descriptor ``ready`` once its socket listens (or another service of the key holds the lock)."""
    from filelock import FileLock, Timeout

    lock = FileLock(str(where / f"{name}.lock"), timeout=0)
    try:
        lock.acquire()
    except Timeout:  # another client started it first: its socket is the one to wait for
        os.write(ready, b"1")
        return
    idle_s = float(os.environ.get(IDLE_VARIABLE, IDLE_S))
    server = Service(where, name, idle_s, threads, env)
    os.write(ready, b"1")
    os.close(ready)

    def watch() -> None:
        # older services retired once this one serves (two starting at once each ask the other, so neither may
        # wait for an answer before it answers), files of services long gone removed
        try:
            others = sorted(running(where, besides=name), key=lambda s: s["idle_s"])
            retire([s["key"] for s in others[MAX_SERVICES - 1 :]], where)
            prune(where, {name, *(s["key"] for s in others)})
        except Exception:  # noqa: BLE001 - housekeeping only: the idle watch below must run whatever happens here
            traceback.print_exc()
        while True:
            try:
                if server.idle():
                    break
            except Exception:  # noqa: BLE001 - said in the log; the service still ends once idle
                traceback.print_exc()
            server.retire_now.wait(min(1.0, max(idle_s / 4, 0.05)))
        server.shutdown()

    threading.Thread(target=watch, name="idle-watch", daemon=True).start()
    try:
        server.serve_forever(poll_interval=0.1)  # how soon it ends once the idle watch says so
    finally:
        server.end()
        lock.release()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="parity's worker service (started by parity itself)")
    parser.add_argument("folder", type=Path)
    parser.add_argument("key")
    parser.add_argument("threads", type=int)
    parser.add_argument("env", type=json.loads)
    parser.add_argument("package", help="the parity package folder the client runs")
    arguments = parser.parse_args()
    import parity

    if Path(parity.__file__).parent != Path(arguments.package):  # templates would import other code than the client's
        raise SystemExit(
            f"this service imports parity from {Path(parity.__file__).parent}, its client {arguments.package}"
        )
    # the service is nobody's child but init's: the process the client started ends once the service listens (exit
    # 0), or at once when it could not start (exit 1, its reason in the log), and the client reaps it
    ready_read, ready_write = os.pipe()
    if os.fork():
        os.close(ready_write)
        os._exit(0 if os.read(ready_read, 1) else 1)
    os.close(ready_read)
    serve(arguments.folder, arguments.key, arguments.threads, arguments.env, ready_write)
