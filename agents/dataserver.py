"""The agent's data server: shards and checkpoints, peer to peer, streamed, checked.

Routes (all but /health need a ticket made with the cluster's peer key, which only agents hold):

* ``GET /shards/<dataset>/<index>``: stream a shard; ticket ``("get", dataset, index, ts)``.  A
  ``Range: bytes=N-`` header asks for the rest from byte N (206), as a broken copy resumes; the bytes
  sent count against the agent's bandwidth bound (``agents.throttle``).
* ``PUT /shards/<dataset>/<index>?sha256=H``: upload a shard; ticket ``("put", node, dataset, index, H)``
  issued by the server for this node; the body must hash to H and be a GSHARD1 file or a tar (a
  WebDataset shard), or it is discarded.
* ``GET|PUT /checkpoints/<job>/<file>``: a job's checkpoint files; ticket ``("ckpt", job, file, ts)``;
  GET also takes a read-only ``("fetch", job, file, ts)`` (``gsched fetch``, issued by the server).
* ``POST /scan/<dataset>``: hash the files under a folder of this node's data dir for ``gsched data add``
  (body ``{"path", "glob"}``); ticket ``("scan", node, dataset, ts)`` issued by the server.  The answer
  streams JSON lines: ``{"file", "done", "total"}`` while hashing, then ``{"files": [...]}`` or
  ``{"error", "status"}``.  Refusals found before hashing are plain HTTP errors (``agents.inplace``).
* ``POST /link/<dataset>/<index>``: make a scanned file that shard (a hard link); body ``{"path"}``;
  ticket ``("link", node, dataset, index, sha256)`` issued by the server once it stored the manifest.
* ``POST /nudge``: the server's cycle bound ranks here: heartbeat now instead of at the next tick;
  ticket ``("nudge", node, ts)``.  It carries nothing; the assignments come with the heartbeat reply.

With a certificate and key (``gsched agent --tls-cert/--tls-key``) it serves HTTPS only: a plain-HTTP
request gets no answer (its bytes fail the handshake) and the agent reports ``https://host:port``
(scheduler/protocol/peers.py), so that peers connect with TLS and verify it with the cluster's CA.  The
handshake runs in the request's own thread, within ``HANDSHAKE_TIMEOUT_S``, never in the accepting one.

Names are validated and every path is resolved and checked to lie inside the data dir, so ``..``,
absolute paths and symlinks cannot reach outside it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from agents.inplace import InPlaceError, describe, find_files, hash_file, link_shard
from agents.shardfile import (
    CKPT_NAME,
    MAGIC,
    background_priority,
    inside,
    prune_checkpoints,
    shard_path,
    valid_name,
)
from agents.throttle import UNLIMITED, Throttle
from scheduler.protocol.tickets import check_ticket

log = logging.getLogger("gsched.agent.data")
TICKET_TTL_S = 300  # a ticket is good for this long after it was made (it is checked when a request starts)
TICKET_SKEW_S = 30  # and from this much before: clocks of two nodes may disagree a little, not by minutes
CHUNK = 1 << 20
HANDSHAKE_TIMEOUT_S = 30  # a peer that connects and never finishes its TLS handshake is closed after this
_RANGE = re.compile(r"bytes=([0-9]{1,15})-")


def checkpoint_dir(data_dir: Path, job_id: int) -> Path:
    return data_dir / ".gsched" / "jobs" / str(int(job_id)) / "checkpoints"


def checkpoint_path(data_dir: Path, job_id: int, name: str) -> Path:
    if not CKPT_NAME.fullmatch(name):
        raise ValueError(f"invalid checkpoint name {name!r}")
    return inside(data_dir, str(checkpoint_dir(Path("."), job_id) / name))


def _number(text: str) -> bool:
    """A shard index or job id in a path: ASCII digits only (``str.isdigit`` also takes other scripts')."""
    return 0 < len(text) <= 12 and text.isascii() and text.isdigit()


class DataServer:
    def __init__(self, host: str, port: int, data_dir: Path, node: str, peer_key: Callable[[], str | None],
                 on_shard: Callable[[str, int, Path, str], None], on_nudge: Callable[[], None] | None = None,
                 throttle: Throttle = UNLIMITED, tls: tuple[str, str] | None = None) -> None:
        """``tls``: (certificate file, key file): serve HTTPS only.  Raises ``ValueError`` when they do not
        load (the files, and what is wrong with them)."""
        self.data_dir = data_dir
        self.throttle = throttle
        self.on_nudge = on_nudge
        self.node = node
        self.peer_key = peer_key
        self.on_shard = on_shard
        self.bytes_served = 0  # file bytes handed to the kernel for a peer, over all responses
        self.sending = 0  # responses whose body is being written now
        self._counts = threading.Condition()  # guards both counts: each response is written by its own thread
        self.scanned: dict[str, tuple[tuple[int, int, int], str]] = {}  # real path -> (ino, size, mtime), sha256
        self._scan_lock = threading.Lock()
        handler = _make_handler(self)
        self.tls = tls is not None
        self.httpd = (_TLSServer((host, port), handler, _server_context(*tls)) if tls
                      else _PeerServer((host, port), handler))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="dataserver", daemon=True)

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    def start(self) -> None:
        self.thread.start()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no response is being written; False if one still is after ``timeout`` seconds.  A
        reader gets a body's last byte before its writer has counted it, and a writer whose peer hung up can
        still hand a block to the kernel: ``bytes_served`` is final only once this returns True."""
        with self._counts:
            return self._counts.wait_for(lambda: self.sending == 0, timeout)

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _server_context(cert: str, key: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"cannot load the data server's TLS certificate {cert} with key {key}: {e}") from None
    return ctx


class _PeerServer(ThreadingHTTPServer):
    """A peer that hangs up before its answer (a copy it gave up on, a killed agent) is a line in the
    log, not a traceback: only other errors get the standard library's report."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        err = sys.exc_info()[1]
        if isinstance(err, ConnectionError):
            log.info("peer %s hung up: %s", client_address[0] if client_address else "?", err)
            return
        super().handle_error(request, client_address)


class _TLSServer(_PeerServer):
    """HTTPS only: each connection's handshake happens in its request thread (``finish_request``), so a
    peer that stalls it holds up nobody else; one that fails it (plain HTTP, an untrusting client) is
    closed with a line in the log."""

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 context: ssl.SSLContext) -> None:
        super().__init__(address, handler)
        self.context = context

    def finish_request(self, request: socket.socket | tuple[bytes, socket.socket],  # type: ignore[override]
                       client_address: tuple[str, int]) -> None:
        assert isinstance(request, socket.socket)
        request.settimeout(HANDSHAKE_TIMEOUT_S)
        try:
            conn = self.context.wrap_socket(request, server_side=True)
        except (OSError, ssl.SSLError) as e:
            log.info("TLS handshake with %s failed: %s", client_address[0], e)
            return
        conn.settimeout(None)
        try:
            super().finish_request(conn, client_address)  # type: ignore[arg-type]
        finally:
            conn.close()


def _make_handler(srv: DataServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args: object) -> None:
            log.debug("%s " + fmt, self.address_string(), *args)

        def _send(self, code: int, text: str) -> None:
            body = (text + "\n").encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _route(self) -> tuple[str, list[str], dict[str, list[str]]] | None:
            url = urlsplit(self.path)
            parts = [unquote(p) for p in url.path.split("/") if p]
            return (parts[0] if parts else ""), parts[1:], parse_qs(url.query)

        def _fresh_ticket(self, *parts: object) -> bool:
            key = srv.peer_key()
            given = self.headers.get("X-Gsched-Ticket", "")
            try:
                ts = int(self.headers.get("X-Gsched-Time", "0"))
            except ValueError:
                return False
            age = time.time() - ts
            if not key or age > TICKET_TTL_S or age < -TICKET_SKEW_S:
                return False
            return check_ticket(key, given, *parts, ts)

        def do_GET(self) -> None:  # noqa: N802
            kind, rest, _ = self._route()  # type: ignore[misc]
            if kind == "health":
                return self._send(200, "ok")
            try:
                if kind == "shards" and len(rest) == 2 and valid_name(rest[0]) and _number(rest[1]):
                    if not self._fresh_ticket("get", rest[0], int(rest[1])):
                        return self._send(403, "a valid agent ticket is required")
                    path = shard_path(srv.data_dir, rest[0], int(rest[1]))
                elif kind == "checkpoints" and len(rest) == 2 and _number(rest[0]):
                    # an agent's ticket, or the read-only one `gsched fetch` gets from the server
                    if not (self._fresh_ticket("ckpt", int(rest[0]), rest[1])
                            or self._fresh_ticket("fetch", int(rest[0]), rest[1])):
                        return self._send(403, "a valid agent ticket is required")
                    path = checkpoint_path(srv.data_dir, int(rest[0]), rest[1])
                else:
                    return self._send(404, "no such resource")
            except ValueError as e:
                return self._send(400, str(e))
            if not path.is_file() or path.is_symlink():
                return self._send(404, "not on this node")
            size = path.stat().st_size
            start = 0
            ask = self.headers.get("Range", "")
            if ask:  # only "bytes=N-": what a resumed copy asks for
                m = _RANGE.fullmatch(ask.strip())
                if m is None or int(m.group(1)) >= size:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{size}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                start = int(m.group(1))
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
            else:
                self.send_response(200)
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size - start))
            self.end_headers()
            with srv._counts:
                srv.sending += 1
            try:
                with open(path, "rb") as f:
                    f.seek(start)
                    try:
                        while block := f.read(CHUNK):
                            srv.throttle.take(len(block))
                            self.wfile.write(block)
                            with srv._counts:
                                srv.bytes_served += len(block)
                    except (BrokenPipeError, ConnectionResetError):  # the peer went; it resumes with a Range
                        log.info("%s stopped reading %s at byte %d", self.address_string(), path.name, f.tell())
                        self.close_connection = True
            finally:
                with srv._counts:
                    srv.sending -= 1
                    srv._counts.notify_all()

        def _json_body(self) -> dict[str, object] | None:
            try:
                length = int(self.headers.get("Content-Length", "0"))
                doc = json.loads(self.rfile.read(length)) if 0 < length <= 65536 else None
            except (ValueError, OSError):
                doc = None
            return doc if isinstance(doc, dict) else None

        def _scan(self, dataset: str) -> None:
            """Hash the files a ``gsched data add`` names (see the module docstring), streaming progress."""
            if not self._fresh_ticket("scan", srv.node, dataset):
                return self._send(403, "a valid scan ticket for this node is required")
            doc = self._json_body()
            if doc is None or not isinstance(doc.get("path"), str) or not isinstance(doc.get("glob", "*"), str):
                return self._send(400, 'body must be JSON {"path": "...", "glob": "..."}')
            try:
                found = find_files(srv.data_dir, srv.node, str(doc["path"]), str(doc.get("glob") or "*"))
            except InPlaceError as e:
                return self._send(e.status, str(e))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-ndjson")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            last = [0.0]

            def line(obj: object) -> None:
                self.wfile.write((json.dumps(obj) + "\n").encode())
                self.wfile.flush()

            def progress(name: str, done: int, total: int) -> None:
                now = time.monotonic()
                if now - last[0] >= 0.2 or done >= total:
                    last[0] = now
                    line({"file": name, "done": done, "total": total})

            files = []
            try:
                for f in found:
                    sha, st = hash_file(srv.node, f.path, progress, label=f.rel)
                    with srv._scan_lock:
                        srv.scanned[str(f.path)] = ((st.st_ino, st.st_size, st.st_mtime_ns), sha)
                    files.append({"name": f.rel, "path": f.data_rel, "bytes": st.st_size, "sha256": sha,
                                  **describe(f.path)})
            except InPlaceError as e:
                return line({"error": str(e), "status": e.status})
            line({"files": files})

        def _link(self, dataset: str, index: int) -> None:
            doc = self._json_body()
            sha = (parse_qs(urlsplit(self.path).query).get("sha256") or [""])[0]
            key = srv.peer_key()
            if not key or not check_ticket(key, self.headers.get("X-Gsched-Ticket", ""), "link", srv.node, dataset,
                                           index, sha):
                return self._send(403, "a valid link ticket for this node is required")
            if doc is None or not isinstance(doc.get("path"), str):
                return self._send(400, 'body must be JSON {"path": "..."}')

            def known(path: Path, st: os.stat_result) -> str | None:
                with srv._scan_lock:
                    ident, h = srv.scanned.get(str(path), ((0, 0, 0), ""))
                return h if ident == (st.st_ino, st.st_size, st.st_mtime_ns) else None

            try:
                dest = link_shard(srv.data_dir, srv.node, str(doc["path"]), dataset, index, sha, known)
            except InPlaceError as e:
                return self._send(e.status, str(e))
            except ValueError as e:
                return self._send(400, str(e))
            srv.on_shard(dataset, index, dest, sha)
            return self._send(201, "linked")

        def do_POST(self) -> None:  # noqa: N802
            kind, rest, _ = self._route()  # type: ignore[misc]
            if kind == "scan" and len(rest) == 1 and valid_name(rest[0]):
                return self._scan(rest[0])
            if kind == "link" and len(rest) == 2 and valid_name(rest[0]) and _number(rest[1]):
                return self._link(rest[0], int(rest[1]))
            if kind != "nudge" or rest or srv.on_nudge is None:
                return self._send(404, "no such resource")
            if not self._fresh_ticket("nudge", srv.node):
                return self._send(403, "a valid server ticket is required")
            srv.on_nudge()
            return self._send(200, "ok")

        def do_PUT(self) -> None:  # noqa: N802
            kind, rest, query = self._route()  # type: ignore[misc]
            try:
                length = int(self.headers.get("Content-Length", "-1"))
            except ValueError:
                length = -1
            if length < 0:
                return self._send(411, "Content-Length is required")
            try:
                if kind == "shards" and len(rest) == 2 and valid_name(rest[0]) and _number(rest[1]):
                    sha = (query.get("sha256") or [""])[0]
                    key = srv.peer_key()
                    if not key or not check_ticket(key, self.headers.get("X-Gsched-Ticket", ""), "put", srv.node,
                                                   rest[0], int(rest[1]), sha):
                        return self._send(403, "a valid upload ticket for this node is required")
                    path = shard_path(srv.data_dir, rest[0], int(rest[1]))
                    expect_magic = True
                elif kind == "checkpoints" and len(rest) == 2 and _number(rest[0]):
                    if not self._fresh_ticket("ckpt", int(rest[0]), rest[1]):
                        return self._send(403, "a valid agent ticket is required")
                    background_priority()  # a mirror nobody waits on: this request's thread only
                    path = checkpoint_path(srv.data_dir, int(rest[0]), rest[1])
                    sha = self.headers.get("X-Gsched-Sha256", "")
                    expect_magic = False
                else:
                    return self._send(404, "no such resource")
            except ValueError as e:
                return self._send(400, str(e))
            if path.is_symlink():
                return self._send(400, "refusing to write through a symlink")
            # A job's mirrored checkpoints are for the agent alone here (0700); a rank that resumes
            # from them on this node lets its account's group read them (agents/launcher.py).
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o755 if kind == "shards" else 0o700)
            tmp = path.with_name(path.name + f".part{threading.get_ident()}")
            digest = hashlib.sha256()
            remaining = length
            first = b""
            with open(tmp, "wb") as f:
                while remaining > 0:
                    block = self.rfile.read(min(CHUNK, remaining))
                    if not block:
                        break
                    if len(first) < 265:
                        first += block[: 265 - len(first)]
                    digest.update(block)
                    f.write(block)
                    remaining -= len(block)
            if remaining or (sha and digest.hexdigest() != sha) or (expect_magic and not (first.startswith(MAGIC) or first[257:262] == b"ustar")):
                tmp.unlink(missing_ok=True)
                return self._send(422, "upload incomplete or checksum mismatch; discarded")
            os.replace(tmp, path)
            if kind == "shards":
                srv.on_shard(rest[0], int(rest[1]), path, digest.hexdigest())
            else:  # a mirrored checkpoint: keep as many as the job keeps on its rank 0's node
                keep = self.headers.get("X-Gsched-Keep", "0")
                prune_checkpoints(path.parent, int(keep) if _number(keep) else 0)
            self._send(201, "stored")

    return Handler
