"""The operator's write client keeps a connection for every thread that writes at once
(torchkube/operator/api_client.py): a pool smaller than its writers discards a connection at
each return, and the next request pays a new TLS handshake. Real urllib3 against a server on
loopback."""

import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from kubernetes.config import kube_config

from torchkube.operator.api_client import make_api_client
from torchkube.operator.config import OperatorSettings


class _Slow(BaseHTTPRequestHandler):
    """Answers after a while, so that every writer holds its connection at once."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        time.sleep(0.3)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_every_thread_that_writes_at_once_keeps_its_connection(
    server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: '{server}'}}}}]\n"
        "users: [{name: u, user: {}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    # read once at the client's import from $KUBECONFIG, as the operator's process starts
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
    settings = OperatorSettings(workers=4, api_concurrency=6)
    writers = (
        settings.api_concurrency  # the pod creates' and deletes' pool (Kube.pool)
        + settings.workers  # the reconciles, each in a thread of its own
        + settings.workers  # the writes beside a plan's others (Executor.beside)
        + settings.workers  # the event lanes (Executor.recorders)
        + 1  # the leader's renewals
    )
    pool = make_api_client(settings).rest_client.pool_manager
    caplog.set_level(logging.WARNING, logger="urllib3.connectionpool")
    for _ in range(2):  # the second round reuses what the first returned
        with ThreadPoolExecutor(max_workers=writers) as threads:
            answers = list(threads.map(lambda _: pool.request("GET", f"{server}/"), range(writers)))
        assert {answer.status for answer in answers} == {200}
    discarded = [r.getMessage() for r in caplog.records if "pool is full" in r.getMessage()]
    assert not discarded, f"{len(discarded)} connections discarded: {discarded[0]}"
