"""A local HTTP server standing in for raw.githubusercontent.com and the Hugging Face hub in the
``memgym data download`` tests: ``http.server`` in a thread, serving files or bytes by URL path.

- GitHub raw: ``/<owner>/<repo>/<commit>/<path>`` answered directly.
- Hub: ``/datasets/<repo>/resolve/<revision>/<file>`` answered with a 302 to ``/lfs/<file>``, as the real
  hub redirects large files to its storage, so that a ``Range`` request is followed through a redirect.
- ``Range: bytes=N-`` gets a 206 with ``Content-Range`` (``ignore_range`` answers 200 with the whole body).
- ``cut_once[path] = n``: the next GET of ``path`` sends ``n`` bytes of its body, then drops the connection.
- ``requests``: every (path, Range header) received, in order."""
from __future__ import annotations

import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


class _Handler(BaseHTTPRequestHandler):
    server: "_Server"

    def log_message(self, *args):  # keep pytest output clean
        pass

    def do_GET(self):
        hosts = self.server.hosts
        path = unquote(self.path)
        rng = self.headers.get("Range")
        with hosts.lock:
            hosts.requests.append((path, rng))
            cut = hosts.cut_once.pop(path, None)
        m = re.fullmatch(r"/datasets/[^/]+/[^/]+/resolve/[^/]+/(.+)", path)
        if m:
            self.send_response(302)
            self.send_header("Location", f"/lfs/{m.group(1)}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = hosts.body(path)
        if body is None:
            self.send_error(404)
            return
        start = 0
        if rng and not hosts.ignore_range:
            start = int(re.fullmatch(r"bytes=(\d+)-", rng).group(1))
            if start >= len(body):
                self.send_error(416)
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(body) - start))
        self.end_headers()
        data = memoryview(body)[start:]
        if cut is not None:
            self.wfile.write(data[:cut])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(data)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    hosts: "FakeHosts"


class FakeHosts:
    """``routes``: URL path -> a file or bytes. Use as a context manager; ``url`` is the base URL."""

    def __init__(self, routes: dict[str, Path | bytes] | None = None):
        self.routes: dict[str, Path | bytes] = dict(routes or {})
        self.cut_once: dict[str, int] = {}
        self.ignore_range = False
        self.requests: list[tuple[str, str | None]] = []
        self.lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.hosts = self
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def route(self, url: str, content: Path | bytes) -> str:
        """Serve ``content`` at the path of ``url`` (hub URLs: at the ``/lfs/`` path they redirect to)."""
        path = unquote(urlsplit(url).path)
        m = re.fullmatch(r"/datasets/[^/]+/[^/]+/resolve/[^/]+/(.+)", path)
        path = f"/lfs/{m.group(1)}" if m else path
        self.routes[path] = content
        return path

    def body(self, path: str) -> bytes | None:
        c = self.routes.get(path)
        return c.read_bytes() if isinstance(c, Path) else c

    def __enter__(self) -> "FakeHosts":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()


def closed_port_url() -> str:
    """A base URL on which nothing listens (a port just bound and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"
