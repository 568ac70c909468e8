"""The worker service's process (``python -m parity.run.service_main``, started by ``parity.run.service.start``):
one thread per client, the templates shared under one lock; see ``parity.run.service``."""

from __future__ import annotations

import argparse
import json
import os
import socket
import socketserver
import struct
import threading
import time
from pathlib import Path

from parity.platform.errors import TaskFailed
from parity.run.service import IDLE_S, IDLE_VARIABLE, MAX_SERVICES, MAX_TEMPLATES, receive, retire, running, send
from parity.run.worker import Template, pid_running


class Service(socketserver.ThreadingUnixStreamServer):
    """The server: one thread per client connection, the templates shared under one lock."""

    daemon_threads = True

    def __init__(self, where: Path, name: str, idle_s: float, threads: int, env: dict):
        self.where, self.name, self.idle_s = where, name, idle_s
        self.state = threading.Lock()
        self.templates: dict[tuple, Template] = {}  # (group, threads, env) -> template, least recently used first
        self.owner: dict[int, Template] = {}  # pid of a worker not yet known to have ended -> its template
        self.clients, self.last_active, self.retiring = 0, time.monotonic(), False
        self.spare: Template | None = Template(None, threads, where / f"{name}-spare.log", env)
        self.spare_key = (threads, _env_key(env))
        path = where / f"{name}.sock"
        path.unlink(missing_ok=True)
        super().__init__(str(path), Handler)
        os.chmod(path, 0o600)
        self.inode = os.stat(path).st_ino  # at the end, the socket file is removed only while it is still ours

    def verify_request(self, request, client_address) -> bool:
        credentials = request.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return struct.unpack("3i", credentials)[1] == os.getuid()

    def fork(self, message: dict, fd: int) -> dict:
        group, threads, env = str(message["group"]), int(message["threads"]), dict(message["env"])
        template = self._template(group, threads, env)
        try:
            pid = template.fork_onto(
                fd,
                str(message["log"]),
                str(message["cwd"]),
                list(message["sys_path"]),
                int(message["client"]),
                float(message["timeout_s"]),
            )
        except TaskFailed as error:
            return {"error": str(error), "kind": error.kind}
        with self.state:
            self.owner[pid] = template
        return {"pid": pid}

    def _template(self, group: str, threads: int, env: dict) -> Template:
        slot = (group, threads, _env_key(env))
        with self.state:
            template = self.templates.pop(slot, None)
            if template is None or not template.alive:
                if template is not None:
                    template.close()
                spare, self.spare = self.spare, None
                if spare is not None and spare.alive and self.spare_key == (threads, _env_key(env)):
                    spare.adopt(group, self.where / f"{self.name}-{group}.log")
                    template = spare
                else:
                    if spare is not None:
                        spare.close()
                    template = Template(group, threads, self.where / f"{self.name}-{group}.log", env)
            self.templates[slot] = template
            busy = {id(t) for t in self._running().values()}
            for old in [s for s, t in self.templates.items() if s != slot and id(t) not in busy]:
                if len(self.templates) <= MAX_TEMPLATES:
                    break
                self.templates.pop(old).close()
            return template

    def _running(self) -> dict[int, Template]:
        """The workers still running (under ``state``)."""
        for pid, template in list(self.owner.items()):
            if template.exit_code(pid) is not None:
                del self.owner[pid]
        return self.owner

    def status(self, message: dict) -> dict:
        pid = int(message["pid"])
        with self.state:
            template = self.owner.get(pid)
        if template is None:
            return {"exit": None if pid_running(pid) else 0}
        code = template.exit_code(pid, bool(message.get("wait")))
        if code is not None:
            with self.state:
                self.owner.pop(pid, None)
        return {"exit": code}

    def info(self) -> dict:
        with self.state:
            return {
                "pid": os.getpid(),
                "key": self.name,
                "clients": self.clients - 1,  # the one asking aside
                "idle_s": round(time.monotonic() - self.last_active, 1),
                "templates": [group for group, _, _ in self.templates],
                "workers": len(self._running()),
                "retiring": self.retiring,
            }

    def idle(self) -> bool:
        with self.state:
            if self.clients or self._running():
                self.last_active = time.monotonic()
                return False
            return self.retiring or time.monotonic() - self.last_active > self.idle_s

    def end(self) -> None:
        with self.state:
            for template in [*self.templates.values(), *([self.spare] if self.spare else [])]:
                template.close()
            self.templates.clear()
        path = self.where / f"{self.name}.sock"
        try:
            if os.stat(path).st_ino == self.inode:
                path.unlink()
        except OSError:
            pass
        self.server_close()


def _env_key(env: dict) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in env.items()))


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
                    send(self.request, self._answer(service, message, fds))
                except Exception as error:  # noqa: BLE001 - a malformed request is that client's error, not ours
                    send(self.request, {"error": f"{type(error).__name__}: {error}", "kind": "died"})
                finally:
                    for fd in fds:
                        os.close(fd)
        finally:
            with service.state:
                service.clients -= 1
                service.last_active = time.monotonic()

    @staticmethod
    def _answer(service: Service, message: dict, fds: list[int]) -> dict:
        op = message.get("op")
        if op == "fork":
            if len(fds) != 1:
                raise ValueError("a fork request without its descriptor")
            return service.fork(message, fds[0])
        if op == "status":
            return service.status(message)
        if op == "info":
            return service.info()
        if op == "retire":
            service.retiring = True
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
    others = sorted(running(where, besides=name), key=lambda s: s["idle_s"])
    retire([s["key"] for s in others[MAX_SERVICES - 1 :]], where)

    def watch() -> None:
        while not server.idle():
            time.sleep(min(1.0, max(idle_s / 4, 0.05)))
        server.shutdown()

    threading.Thread(target=watch, name="idle-watch", daemon=True).start()
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.end()
        lock.release()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="parity's worker service (started by parity itself)")
    parser.add_argument("folder", type=Path)
    parser.add_argument("key")
    parser.add_argument("threads", type=int)
    parser.add_argument("env", type=json.loads)
    arguments = parser.parse_args()
    # the service is nobody's child but init's: the process the client started ends once the service listens (exit
    # 0), or at once when it could not start (exit 1, its reason in the log), and the client reaps it
    ready_read, ready_write = os.pipe()
    if os.fork():
        os.close(ready_write)
        os._exit(0 if os.read(ready_read, 1) else 1)
    os.close(ready_read)
    serve(arguments.folder, arguments.key, arguments.threads, arguments.env, ready_write)
