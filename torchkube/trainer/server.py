"""The trainer's HTTP server: ``/metrics`` for Prometheus and ``/progress`` for the operator.

One server per pod (on local rank 0), on ``TORCHKUBE_METRICS_PORT``. ``/progress`` adds the
job's in-place restarts of workers from the rendezvous store (``torchkube.elastic.restarts``).
"""

import json
import logging
import os
import selectors
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry
from prometheus_client.exposition import generate_latest

from torchkube.elastic.restarts import RestartBoard
from torchkube.trainer.reporting import ProgressReporter

log = logging.getLogger("torchkube.trainer")


class _Handler(BaseHTTPRequestHandler):
    server: "MetricsServer"

    def do_GET(self) -> None:
        if self.path == "/metrics":
            body, ctype = generate_latest(self.server.registry), CONTENT_TYPE_LATEST
        elif self.path == "/progress":
            record = self.server.progress.record
            board = self.server.restarts
            if board is not None:
                restarts = [r.model_dump(by_alias=True, exclude_none=True) for r in board.read()]
                record = {**record, "inPlaceRestarts": restarts}
            body, ctype = json.dumps(record).encode(), "application/json"
        else:
            self.send_error(404, "try /metrics or /progress")
            return
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # scrapes are not log lines
        pass


class MetricsServer(ThreadingHTTPServer):
    """``/metrics`` (Prometheus text format) and ``/progress`` (JSON) on a background thread.

    The thread waits on the listening socket and on a pipe that :meth:`close` writes to, not
    on socketserver's polled shutdown flag: a worker that fails (a dead peer) closes its
    server before it exits, and its launcher restarts the round only once it has exited, so
    a poll's wait would be part of every recovery."""

    daemon_threads = True
    timeout = 0
    """``handle_request`` looks again with no wait before it accepts: a readiness the
    selector reported that no longer stands (a spurious wake-up) returns to the selector,
    which also watches the wake-up pipe, instead of waiting for the next connection."""

    def __init__(self, port: int, registry: CollectorRegistry, progress: ProgressReporter):
        super().__init__(("", port), _Handler)
        self.registry, self.progress = registry, progress
        self.restarts = RestartBoard.from_env()
        """The job's in-place restarts, every pod's, served with the progress report."""
        self._wake_read, self._wake_write = os.pipe()
        self._thread = threading.Thread(target=self._serve, name="metrics", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self, selectors.EVENT_READ)
            selector.register(self._wake_read, selectors.EVENT_READ)
            while True:
                ready = [key.fileobj for key, _ in selector.select()]
                if self._wake_read in ready:
                    return
                self.handle_request()

    def close(self) -> None:
        """Stop serving and free the port; a second call does nothing (the pipe's numbers
        may belong to another file by then)."""
        if self._wake_write < 0:
            return
        os.write(self._wake_write, b"x")
        self._thread.join()
        self.server_close()
        os.close(self._wake_read)
        os.close(self._wake_write)
        self._wake_read = self._wake_write = -1


def start_metrics_server(
    port: int, registry: CollectorRegistry, progress: ProgressReporter
) -> MetricsServer | None:
    """Serve metrics when a port is configured; a busy port is a warning, not a failure."""
    if port <= 0:
        return None
    try:
        return MetricsServer(port, registry, progress)
    except OSError as e:
        log.warning("metrics server not started on port %d: %s", port, e)
        return None
