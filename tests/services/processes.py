"""Process helpers for the crash tests: a whole process tree killed at once, the way a
machine, a pod or the OOM killer ends it (no signal handler runs, nothing is flushed)."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
        tree.setdefault(ppid, []).append(int(proc.name))
    return tree


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it."""
    tree = _children()
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(tree.get(current, []))
    return found


def kill_tree(pid: int) -> list[int]:
    """SIGKILL `pid` and all its descendants (stopped first, so none forks away)."""
    victims = descendants(pid)
    for victim in victims:
        try:
            os.kill(victim, signal.SIGSTOP)
        except ProcessLookupError:
            pass
    victims = descendants(pid)  # whatever forked before it stopped
    for victim in victims:
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return victims


@dataclass
class WebhookServer:
    """A webhook receiver on loopback: records every POST body (JSON)."""

    received: list[dict[str, Any]] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/hook"

    def start(self) -> None:
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    received.append(json.loads(body))
                except ValueError:
                    received.append({"raw": body.decode(errors="replace")})
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.address_family = socket.AF_INET
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
