"""An HTTP-aware loopback proxy in front of the S3 server that answers a share of the
requests itself with the failures S3 shows under stress.

Each request is read whole (request line, headers, body). Then it is either forwarded to
the real S3 server and its answer relayed, or met with a fault:

- `slowdown`     503 with S3's `SlowDown` XML error
- `internal`     500 with S3's `InternalError` XML error
- `unavailable`  503 with S3's `ServiceUnavailable` XML error
- `html_502`     502 with an HTML page, as a load balancer in front of S3 sends
- `drop`         the connection is closed without an answer (the request never reached S3)
- `lost_answer`  forwarded, then the connection is closed before S3's answer is relayed
                 (the request took effect, the client does not know)
- `truncated`    forwarded, then S3's headers and half its body are relayed and the
                 connection is closed (an answer without a body is lost whole)
- `denied`       403 `AccessDenied` XML, to show what must not be retried
- `garbled`      forwarded, then S3's status and headers relayed with a body that is not
                 XML (a listing that cannot be parsed; never schedule it for a download)
- `hang`         the request is read and never answered (the connection stays open)

`schedule` picks the fault of each request: `every_nth(3, kinds)` faults requests 1, 4,
7, … cycling through `kinds` (deterministic counts whatever the thread interleaving);
`first_n(2, "slowdown")` faults the first two only.
"""

from __future__ import annotations

import http.client
import io
import socket
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Sequence

from tests.services.postgres import free_port

FAULTS = ("slowdown", "internal", "unavailable", "html_502", "drop", "lost_answer", "truncated")
"""The transient faults; `denied`, `garbled` and `hang` are only used on purpose."""

Schedule = Callable[[int], str | None]
"""Request number (0-based, in arrival order) → fault kind, or None to forward."""


def every_nth(n: int, kinds: Sequence[str] = FAULTS) -> Schedule:
    def pick(i: int) -> str | None:
        return kinds[(i // n) % len(kinds)] if i % n == 1 else None

    return pick


def first_n(n: int, kind: str) -> Schedule:
    return lambda i: kind if i < n else None


def always(kind: str) -> Schedule:
    return lambda _: kind


def never(_: int) -> str | None:
    return None


_XML_ERRORS = {
    "slowdown": (503, "Service Unavailable", "SlowDown", "Please reduce your request rate."),
    "internal": (
        500,
        "Internal Server Error",
        "InternalError",
        "We encountered an internal error.",
    ),
    "unavailable": (
        503,
        "Service Unavailable",
        "ServiceUnavailable",
        "Service is unable to handle request.",
    ),
    "denied": (403, "Forbidden", "AccessDenied", "Access Denied"),
}
_HTML_502 = (
    b"<html><head><title>502 Bad Gateway</title></head><body><h1>502 Bad Gateway</h1></body></html>"
)


class S3FaultProxy:
    def __init__(self, target_port: int, schedule: Schedule = never) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.schedule = schedule
        self.counts: Counter[str] = Counter()
        """Requests seen, by fault kind; `forwarded` for those relayed untouched."""
        self._requests = 0
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._clients: set[socket.socket] = set()
        self._stopped = threading.Event()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def requests(self) -> int:
        return self._requests

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()
        with self._lock:
            if self._listener is not None:
                self._listener.close()
                self._listener = None
            for client in self._clients:
                _close(client)
            self._clients.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            with self._lock:
                self._clients.add(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _next_fault(self) -> str | None:
        with self._lock:
            fault = self.schedule(self._requests)
            self._requests += 1
            self.counts[fault or "forwarded"] += 1
            return fault

    def _serve(self, client: socket.socket) -> None:
        reader = client.makefile("rb")
        try:
            while True:
                request = _read_request(reader)
                if request is None:
                    return
                method, target, headers, body = request
                fault = self._next_fault()
                if fault == "drop":
                    return
                if fault == "hang":
                    self._stopped.wait()
                    return
                if fault in _XML_ERRORS:
                    client.sendall(_xml_error(fault, method, target))
                    continue
                if fault == "html_502":
                    client.sendall(
                        _response(
                            502, "Bad Gateway", [("Content-Type", "text/html")], _HTML_502, method
                        )
                    )
                    continue
                head, answer = self._forward(method, target, headers, body)
                if fault == "lost_answer":
                    return
                if fault == "truncated":
                    client.sendall(head + answer[: len(answer) // 2] if answer else b"")
                    return
                if fault == "garbled" and answer:
                    mangled = b"<ListBucketResult><Contents><Key>" + b"\x00" * len(answer)
                    head = head.replace(
                        f"Content-Length: {len(answer)}".encode(),
                        f"Content-Length: {len(mangled)}".encode(),
                    )
                    client.sendall(head + mangled)
                    continue
                client.sendall(head + answer)
        except OSError:
            return
        finally:
            reader.close()
            with self._lock:
                self._clients.discard(client)
            _close(client)

    def _forward(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[bytes, bytes]:
        """S3's answer, as the head (status line and headers) and the body."""
        conn = http.client.HTTPConnection("127.0.0.1", self.target_port, timeout=60)
        try:
            # The client signed the Host header it sent; keep every header as it came.
            conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
            for name, value in headers:
                conn.putheader(name, value)
            conn.endheaders(body or None)
            response = conn.getresponse()
            data = response.read()
            kept = [
                (k, v)
                for k, v in response.getheaders()
                if k.lower() not in ("transfer-encoding", "connection", "content-length")
            ]
            if method == "HEAD":
                length = response.getheader("Content-Length")
                kept.append(("Content-Length", length or "0"))
                return _head(response.status, response.reason, kept), b""
            kept.append(("Content-Length", str(len(data))))
            return _head(response.status, response.reason, kept), data
        finally:
            conn.close()


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def _read_request(
    reader: io.BufferedReader,
) -> tuple[str, str, list[tuple[str, str]], bytes] | None:
    readline, read = reader.readline, reader.read
    line = readline(65537)
    if not line:
        return None
    method, target, _version = line.decode("latin-1").split()
    headers: list[tuple[str, str]] = []
    while True:
        raw = readline(65537)
        if raw in (b"\r\n", b"\n", b""):
            break
        name, _, value = raw.decode("latin-1").partition(":")
        headers.append((name.strip(), value.strip()))
    lowered = {k.lower(): v for k, v in headers}
    if lowered.get("transfer-encoding", "").lower() == "chunked":
        chunks = []
        while True:
            size = int(readline(65537).split(b";")[0], 16)
            if size == 0:
                readline(65537)
                break
            chunks.append(read(size))
            readline(65537)
        body = b"".join(chunks)
        headers = [(k, v) for k, v in headers if k.lower() != "transfer-encoding"]
        headers.append(("Content-Length", str(len(body))))
    else:
        body = read(int(lowered.get("content-length", "0")))
    return method, target, headers, body


def _xml_error(kind: str, method: str, target: str) -> bytes:
    status, reason, code, message = _XML_ERRORS[kind]
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        f"<Resource>{target.split('?')[0]}</Resource><RequestId>{uuid.uuid4().hex}</RequestId></Error>"
    ).encode()
    return _response(status, reason, [("Content-Type", "application/xml")], body, method)


def _head(status: int, reason: str, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason}", *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _response(
    status: int, reason: str, headers: list[tuple[str, str]], body: bytes, method: str
) -> bytes:
    # A HEAD answer announces its length but carries no body.
    head = _head(status, reason, [*headers, ("Content-Length", str(len(body)))])
    return head if method == "HEAD" else head + body
