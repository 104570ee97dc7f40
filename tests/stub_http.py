"""One loopback HTTP(S) server for tests that stand in for a remote end (a pod's
``/progress``, a kubelet's log endpoint, a data source's web server): the test says what each
GET is answered with; the server records the paths asked for."""

import ssl
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Reply:
    """A 200 answer. ``body`` as bytes is sent whole with its length; as an iterable of chunks
    it is streamed, each chunk flushed as it comes (a followed log), until it ends."""

    body: bytes | Iterable[bytes]
    content_type: str = "application/octet-stream"


Answer = Callable[[str], Reply | None]
"""The GET's path (with its query) to its reply; None answers 404."""


class StubServer:
    def __init__(self, answer: Answer, tls: tuple[Path, Path] | None = None) -> None:
        """``tls``: a certificate and its key, to serve HTTPS."""
        self.requests: list[str] = []
        requests = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                requests.append(self.path)
                reply = answer(self.path)
                if reply is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", reply.content_type)
                if isinstance(reply.body, bytes):
                    self.send_header("Content-Length", str(len(reply.body)))
                    self.end_headers()
                    self.wfile.write(reply.body)
                    return
                self.end_headers()
                for chunk in reply.body:
                    self.wfile.write(chunk)
                    self.wfile.flush()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        scheme = "http" if tls is None else "https"
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
