"""A loopback HTTP proxy in front of an S3 endpoint that delays every request, so that a
store on 127.0.0.1 costs what a real object store does per request.

Each request waits a drawn delay, then goes to the upstream server unchanged: method,
path, query, body and every end-to-end header as the client sent them (``Host`` too, which
S3 signatures cover, and ``If-None-Match``, so a conditional create stays the upstream's
atomic create).  Only hop-by-hop headers (``Connection``, ``Expect``, ...) stop here.
The delay is ``delay_ms`` plus a uniform jitter in ``[0, jitter_ms]`` plus, with
probability ``tail_p``, an exponential tail of mean ``tail_ms``; draws come from one
generator seeded with ``seed``, in the order requests arrive.

The proxy keeps its own account of every request (:class:`ProxyRequest`): its kind as an
object-store operation, the delay applied and when it was received, forwarded and
answered.  ``GET /__latency_proxy__/stats`` answers a JSON summary (S3 bucket names cannot
hold ``_``, so no object request takes that path).

In a process of its own (benchmarks, so its threads take no time from the client's)::

    python -m txlog.testing.latency_proxy --upstream http://127.0.0.1:8333 --delay-ms 25

prints ``listening on http://127.0.0.1:PORT`` and serves until SIGTERM;
:func:`start_proxy_process` does that and returns a handle that stops it by pid.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import select
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from txlog.errors import ConfigError

HOST = "127.0.0.1"
STATS_PATH = "/__latency_proxy__/stats"
# Headers that describe one connection, not the request: never forwarded.
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate",
                         "proxy-authorization", "te", "trailer", "transfer-encoding",
                         "upgrade", "expect", "proxy-connection"})
_SAFE_TO_RESEND = frozenset({"GET", "HEAD"})


@dataclass(frozen=True)
class LatencyModel:
    """The per-request delay: ``delay_ms`` + U(0, ``jitter_ms``) + (with probability
    ``tail_p``) Exp(mean ``tail_ms``), drawn from a generator seeded with ``seed``."""

    delay_ms: float = 25.0
    jitter_ms: float = 0.0
    tail_p: float = 0.0
    tail_ms: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("delay_ms", "jitter_ms", "tail_ms"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"LatencyModel.{name} must be a number >= 0, not {value!r}")
        if not 0 <= self.tail_p <= 1:
            raise ConfigError(f"LatencyModel.tail_p is a probability (0..1), not "
                              f"{self.tail_p!r}")

    def generator(self) -> DelayGenerator:
        return DelayGenerator(self)


class DelayGenerator:
    """Draws :class:`LatencyModel` delays in sequence (thread-safe)."""

    def __init__(self, model: LatencyModel) -> None:
        self.model = model
        self._rng = random.Random(model.seed)
        self._lock = threading.Lock()

    def draw_ms(self) -> float:
        m = self.model
        with self._lock:
            delay = m.delay_ms
            if m.jitter_ms:
                delay += self._rng.uniform(0.0, m.jitter_ms)
            if m.tail_p and self._rng.random() < m.tail_p:
                delay += self._rng.expovariate(1.0 / m.tail_ms) if m.tail_ms else 0.0
            return delay


@dataclass(frozen=True)
class ProxyRequest:
    """One request as the proxy saw it (times from ``time.monotonic()``, seconds)."""

    seq: int
    method: str
    kind: str
    path: str
    status: int
    delay_ms: float
    received: float
    forwarded: float
    answered: float
    if_none_match: str | None
    bytes_in: int
    bytes_out: int
    #: Nagle's algorithm was off on the client's connection (see _Handler.setup).
    nodelay: bool


def request_kind(method: str, target: str, headers: Any) -> str:
    """The object-store operation an S3 request is (``put_if_absent``, ``put``, ``get``,
    ``get_range``, ``list``, ``head``, ``delete``, or ``other``)."""
    parts = urlsplit(target)
    query = parse_qs(parts.query, keep_blank_values=True)
    object_key = "/" in parts.path.strip("/")  # path-style: /bucket/key
    if method == "PUT":
        if headers.get("If-None-Match") is not None:
            return "put_if_absent"
        return "put" if object_key else "other"
    if method == "GET":
        if "list-type" in query or not object_key:
            return "list"
        return "get_range" if headers.get("Range") else "get"
    if method == "HEAD":
        return "head"
    if method == "DELETE" or (method == "POST" and "delete" in query):
        return "delete"  # DeleteObject, or DeleteObjects (a batch delete of keys)
    return "other"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, proxy: LatencyProxy) -> None:
        self.proxy = proxy
        super().__init__((HOST, proxy.port), _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    _upstream: http.client.HTTPConnection | None = None

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        # An answer goes out as its status line and headers, then its body: with Nagle's
        # algorithm on, the body waited for the client's delayed ACK of the headers (40 ms
        # on Linux), a cost no object store adds.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def finish(self) -> None:
        # The client's connection is over: so is the upstream one kept for it.
        if self._upstream is not None:
            self._upstream.close()
            self._upstream = None
        super().finish()

    def do_GET(self) -> None:
        if self.path == STATS_PATH:
            self._answer_stats()
        else:
            self._forward()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            pieces: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(pieces)
                pieces.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _answer_stats(self) -> None:
        body = json.dumps(self.server.proxy.stats()).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _connection(self, fresh: bool = False) -> http.client.HTTPConnection:
        if fresh and self._upstream is not None:
            self._upstream.close()
            self._upstream = None
        if self._upstream is None:
            proxy = self.server.proxy
            self._upstream = http.client.HTTPConnection(proxy.upstream_host,
                                                        proxy.upstream_port, timeout=120)
        return self._upstream

    def _send_upstream(self, body: bytes, chunked: bool) -> http.client.HTTPResponse:
        conn = self._connection()
        for attempt in (1, 2):
            try:
                conn.putrequest(self.command, self.path, skip_host=True,
                                skip_accept_encoding=True)
                for name, value in self.headers.items():
                    if name.lower() in _HOP_BY_HOP:
                        continue
                    if chunked and name.lower() == "content-length":
                        continue
                    conn.putheader(name, value)
                if chunked:
                    conn.putheader("Content-Length", str(len(body)))
                conn.endheaders(body if body or self.command in ("PUT", "POST") else None)
                return conn.getresponse()
            except (http.client.RemoteDisconnected, BrokenPipeError,
                    ConnectionResetError):
                # An idle keep-alive connection the upstream closed.  Only a read is sent
                # again; a write is answered 502 and settled by the client, as a real
                # store's dropped connection would be.
                if attempt == 2 or self.command not in _SAFE_TO_RESEND:
                    raise
                conn = self._connection(fresh=True)
        raise AssertionError("unreachable")  # pragma: no cover

    def _forward(self) -> None:
        proxy = self.server.proxy
        received = time.monotonic()
        chunked = "chunked" in (self.headers.get("Transfer-Encoding") or "").lower()
        body = self._read_body()
        kind = request_kind(self.command, self.path, self.headers)
        delay_ms = proxy.delays.draw_ms()
        time.sleep(delay_ms / 1000)  # the modelled network and service time
        forwarded = time.monotonic()
        try:
            resp = self._send_upstream(body, chunked)
            data = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            self._connection(fresh=True)
            proxy.record(kind, self, 502, delay_ms, received, forwarded, len(body), 0)
            self._reply(502, "Bad Gateway", [], f"upstream failed: {exc!r}".encode(), False)
            return
        headers = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP_BY_HOP]
        keep_length = self.command == "HEAD"
        # Recorded before the client has its answer: a client that reads the log next
        # finds its request there.
        proxy.record(kind, self, resp.status, delay_ms, received, forwarded, len(body),
                     len(data))
        self._reply(resp.status, resp.reason, headers, data, keep_length)
        if resp.will_close:
            self._connection(fresh=True)

    def _reply(self, status: int, reason: str, headers: list[tuple[str, str]], data: bytes,
               keep_length: bool) -> None:
        self.send_response_only(status, reason)
        for k, v in headers:
            if k.lower() == "content-length" and not keep_length:
                continue
            self.send_header(k, v)
        if not keep_length:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if data and self.command != "HEAD":
            self.wfile.write(data)


class LatencyProxy:
    """The proxy in this process: ``start()``, then point S3 clients at :attr:`endpoint`;
    ``stop()`` when done (or use it as a context manager)."""

    def __init__(self, upstream: str, model: LatencyModel | None = None, *,
                 port: int = 0) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ConfigError(f"the latency proxy forwards to an http:// endpoint, not "
                              f"{upstream!r}")
        if parts.hostname not in (HOST, "localhost"):
            raise ConfigError(f"the latency proxy forwards to loopback only, not {upstream!r}")
        self.upstream = upstream
        self.upstream_host = parts.hostname
        self.upstream_port = parts.port or 80
        self.model = model or LatencyModel()
        self.delays = self.model.generator()
        self.port = port
        self._lock = threading.Lock()
        self._log: list[ProxyRequest] = []
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> LatencyProxy:
        self._server = _Server(self)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="latency-proxy", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._server = _Server(self)
        self.port = self._server.server_address[1]
        print(f"listening on {self.endpoint}", flush=True)
        self._server.serve_forever()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def __enter__(self) -> LatencyProxy:
        return self.start() if self._server is None else self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def record(self, kind: str, handler: _Handler, status: int, delay_ms: float,
               received: float, forwarded: float, bytes_in: int, bytes_out: int) -> None:
        answered = time.monotonic()
        with self._lock:
            self._log.append(ProxyRequest(
                len(self._log), handler.command, kind, handler.path, status, delay_ms,
                received, forwarded, answered, handler.headers.get("If-None-Match"),
                bytes_in, bytes_out, bool(handler.connection.getsockopt(
                    socket.IPPROTO_TCP, socket.TCP_NODELAY))))

    def log(self) -> list[ProxyRequest]:
        """Every request answered so far, in the order they were answered."""
        with self._lock:
            return list(self._log)

    def stats(self) -> dict[str, Any]:
        log = self.log()
        by_kind: dict[str, list[ProxyRequest]] = {}
        for r in log:
            by_kind.setdefault(r.kind, []).append(r)
        # Where a request's time went at the proxy: the modelled delay, and the upstream
        # server's answer (the rest of what a client measures is its own and the wire's).
        upstream = {k: round(1000 * statistics.median(r.answered - r.forwarded for r in rs), 3)
                    for k, rs in by_kind.items()}
        inside = {k: round(1000 * statistics.median(r.answered - r.received for r in rs), 3)
                  for k, rs in by_kind.items()}
        return {"requests": dict(Counter(r.kind for r in log)), "count": len(log),
                "upstream_ms_p50": upstream, "proxy_ms_p50": inside,
                "delay_ms_total": sum(r.delay_ms for r in log),
                "statuses": {str(k): v for k, v in Counter(r.status for r in log).items()},
                "model": asdict(self.model)}


# -- in a process of its own -----------------------------------------------------------------


@dataclass
class ProxyProcess:
    """A proxy running in a child process; :meth:`stop` ends it by its pid."""

    endpoint: str
    process: subprocess.Popen[str]

    def stats(self) -> dict[str, Any]:
        conn = http.client.HTTPConnection(HOST, int(self.endpoint.rsplit(":", 1)[1]),
                                          timeout=30)
        try:
            conn.request("GET", STATS_PATH)
            out: dict[str, Any] = json.loads(conn.getresponse().read())
            return out
        finally:
            conn.close()

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)


def start_proxy_process(upstream: str, model: LatencyModel | None = None, *,
                        timeout: float = 30.0) -> ProxyProcess:
    """Start ``python -m txlog.testing.latency_proxy`` and wait for its endpoint."""
    m = model or LatencyModel()
    cmd = [sys.executable, "-m", "txlog.testing.latency_proxy", "--upstream", upstream,
           "--delay-ms", str(m.delay_ms), "--jitter-ms", str(m.jitter_ms),
           "--tail-p", str(m.tail_p), "--tail-ms", str(m.tail_ms), "--seed", str(m.seed)]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("listening on "):
            return ProxyProcess(line.split()[-1], proc)
    ProxyProcess("", proc).stop()
    raise RuntimeError(f"the latency proxy did not start (exit code {proc.poll()})")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--upstream", required=True, help="http://127.0.0.1:PORT of the S3 server")
    p.add_argument("--port", type=int, default=0, help="port to listen on (0: any free one)")
    p.add_argument("--delay-ms", type=float, default=25.0)
    p.add_argument("--jitter-ms", type=float, default=0.0)
    p.add_argument("--tail-p", type=float, default=0.0)
    p.add_argument("--tail-ms", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    proxy = LatencyProxy(args.upstream, LatencyModel(
        delay_ms=args.delay_ms, jitter_ms=args.jitter_ms, tail_p=args.tail_p,
        tail_ms=args.tail_ms, seed=args.seed), port=args.port)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    proxy.serve_forever()


if __name__ == "__main__":
    main()
