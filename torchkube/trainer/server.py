"""The trainer's HTTP server: ``/metrics`` for Prometheus and ``/progress`` for the operator.

One server per pod (on local rank 0), on ``TORCHKUBE_METRICS_PORT``. ``/progress`` adds the
job's in-place restarts of workers from the rendezvous store (``torchkube.elastic.restarts``).
"""

import json
import logging
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


SHUTDOWN_POLL_SECONDS = 0.05
"""How often the metrics thread looks for a shutdown request. ``close()`` waits for it, and a
worker that fails (a dead peer) closes the server before it exits, so socketserver's default
(half a second) would delay the launcher's view of the failure by as much."""


class MetricsServer(ThreadingHTTPServer):
    """``/metrics`` (Prometheus text format) and ``/progress`` (JSON) on a background thread."""

    daemon_threads = True

    def __init__(self, port: int, registry: CollectorRegistry, progress: ProgressReporter):
        super().__init__(("", port), _Handler)
        self.registry, self.progress = registry, progress
        self.restarts = RestartBoard.from_env()
        """The job's in-place restarts, every pod's, served with the progress report."""
        self._thread = threading.Thread(
            target=self.serve_forever,
            args=(SHUTDOWN_POLL_SECONDS,),
            name="metrics",
            daemon=True,
        )
        self._thread.start()

    def close(self) -> None:
        self.shutdown()
        self.server_close()


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
