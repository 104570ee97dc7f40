"""Metric names, the metrics/progress HTTP server, progress.json and permanent-error reports."""

import json
import re
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from torchkube.local.ports import free_port
from torchkube.trainer.flops import peak_flops
from torchkube.trainer.loader import RunEnv
from torchkube.trainer.metrics import TrainMetrics
from torchkube.trainer.permanent_error import report_permanent_error
from torchkube.trainer.reporting import ProgressReporter
from torchkube.trainer.server import start_metrics_server


def test_metric_names_follow_prometheus_conventions() -> None:
    metrics = TrainMetrics(job="demo", rank=0)
    names = {m.name: m.type for m in metrics.registry.collect()}
    for required in (
        "torchkube_train_step",
        "torchkube_train_loss",
        "torchkube_train_step_duration_seconds",
        "torchkube_train_tokens",
        "torchkube_train_tokens_per_second",
        "torchkube_train_mfu_ratio",
        "torchkube_train_data_wait_seconds",
        "torchkube_train_checkpoint_save_duration_seconds",
        "torchkube_train_checkpoint_blocking_duration_seconds",
        "torchkube_train_checkpoint_staging_bytes",
        "torchkube_train_checkpoint_load_duration_seconds",
        "torchkube_train_restarts",
        "torchkube_train_world_size",
        "torchkube_train_last_checkpoint_step",
    ):
        assert required in names, required
    for name, kind in names.items():
        assert name.startswith("torchkube_train_"), name
        if kind == "counter":  # exposed with _total
            assert not name.endswith("_total"), name
    for sample in (s for m in metrics.registry.collect() for s in m.samples):
        assert set(sample.labels) - {"le"} == {"job", "rank"}, sample


def test_server_serves_metrics_and_progress(tmp_path: Path) -> None:
    metrics = TrainMetrics(job="demo", rank=0)
    metrics.step.set(42)
    progress = ProgressReporter(tmp_path, enabled=True)
    progress.update(force=True, step=42, total_steps=100, finished=False)
    port = free_port()
    server = start_metrics_server(port, metrics.registry, progress)
    assert server is not None
    try:
        base = f"http://127.0.0.1:{port}"
        text = urllib.request.urlopen(f"{base}/metrics", timeout=5).read().decode()
        assert re.search(r'torchkube_train_step\{job="demo",rank="0"\} 42\.0', text)
        record = json.loads(urllib.request.urlopen(f"{base}/progress", timeout=5).read())
        assert record["step"] == 42 and record["totalSteps"] == 100 and "updated" in record
        assert json.loads((tmp_path / "progress.json").read_text()) == record
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"{base}/other", timeout=5)
        assert start_metrics_server(port, metrics.registry, progress) is None  # busy: a warning
    finally:
        server.close()


def test_closing_the_server_waits_for_no_poll() -> None:
    """A worker that fails closes its server before it exits, and the launcher restarts the
    round only once it has exited: a close that waited for the serving thread's next look
    (socketserver polls its shutdown flag) delayed every recovery by that poll. Closing
    again does nothing."""
    port, progress = free_port(), ProgressReporter(None, enabled=False)
    server = start_metrics_server(port, TrainMetrics("demo", 0).registry, progress)
    assert server is not None
    closing = threading.Thread(target=lambda: [server.close(), server.close()], daemon=True)
    closing.start()
    closing.join(timeout=5)
    assert not closing.is_alive(), "close() waited for the serving thread"
    again = start_metrics_server(port, TrainMetrics("demo", 0).registry, progress)
    assert again is not None, "the port was not freed"
    again.close()


def test_progress_file_is_rate_limited_unless_forced(tmp_path: Path) -> None:
    progress = ProgressReporter(tmp_path, enabled=True, min_interval=3600)
    progress.update(force=True, step=1)
    progress.update(step=2)  # within the interval: kept in memory, not written
    assert json.loads((tmp_path / "progress.json").read_text())["step"] == 1
    assert progress.record["step"] == 2
    progress.update(force=True, step=3)
    assert json.loads((tmp_path / "progress.json").read_text())["step"] == 3
    assert not list(tmp_path.glob(".progress*"))  # no temp files left behind
    silent = ProgressReporter(tmp_path / "other", enabled=False)
    silent.update(force=True, step=9)
    assert not (tmp_path / "other").exists()


@pytest.mark.parametrize(
    ("device", "precision", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989e12),
        ("NVIDIA H100 80GB HBM3", "tf32", 494.5e12),
        ("NVIDIA H100 80GB HBM3", "fp32", 67e12),
        ("NVIDIA H100 PCIe", "bf16", 756e12),
        ("NVIDIA H100 NVL", "bf16", 835.5e12),
        ("NVIDIA H100 NVL", "tf32", 417.5e12),
        ("NVIDIA H200", "bf16", 989e12),
        ("NVIDIA H200 NVL", "bf16", 835.5e12),
        ("NVIDIA B200", "bf16", 2250e12),
        ("NVIDIA B200", "tf32", 1100e12),
        ("AMD Instinct MI300X", "bf16", 1307.4e12),
        ("AMD Instinct MI300X", "fp32", 163.4e12),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312e12),
        ("NVIDIA A100-SXM4-80GB", "tf32", 156e12),
        ("NVIDIA A100-SXM4-80GB", "fp32", 19.5e12),
        ("cpu", "fp32", None),
    ],
)
def test_peak_flops_of_the_precision_used(device: str, precision: str, peak: float | None) -> None:
    """Dense peaks (half the datasheets' "with sparsity" figures), per matmul precision."""
    assert peak_flops(device, precision) == peak


def test_peak_flops_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHKUBE_PEAK_FLOPS", "1e12")
    assert peak_flops("cpu", "fp32") == 1e12


def test_permanent_error_reaches_operator_and_launcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "permanent-error"
    monkeypatch.setenv("TORCHKUBE_PERMANENT_ERROR_FILE", str(marker))
    (tmp_path / "progress.json").write_text(json.dumps({"step": 5}))
    report_permanent_error(
        "dataPath: token file /x does not exist", RunEnv(checkpoint_dir=tmp_path)
    )
    assert capsys.readouterr().err == (
        "torchkube-trainer: error: dataPath: token file /x does not exist\n"
    )
    assert marker.read_text().strip() == "dataPath: token file /x does not exist"
    record = json.loads((tmp_path / "progress.json").read_text())
    assert record["step"] == 5 and record["permanent"] is True and record["exitCode"] == 3


def test_progress_carries_the_jobs_in_place_restarts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every pod's server answers with every pod's in-place restarts, read from the
    rendezvous store the launchers post them to."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    from torchkube.api.contract import Env, InPlaceRestart
    from torchkube.elastic.restarts import RUN_ID, RestartBoard

    store_port = free_port()
    store = TCPStore("127.0.0.1", store_port, is_master=True, timeout=timedelta(seconds=5))
    endpoint = f"127.0.0.1:{store_port}"
    crash = InPlaceRestart(
        pod="demo-worker-1-abc", restart=2, exit_code=7, message="boom", time="2026-11-23T12:00:00Z"
    )
    assert RestartBoard(endpoint, "demo").post(crash)
    monkeypatch.setenv(Env.RENDEZVOUS_ENDPOINT, endpoint)
    monkeypatch.setenv(RUN_ID, "demo")
    metrics, progress = TrainMetrics(job="demo", rank=0), ProgressReporter(None, enabled=False)
    progress.update(step=3)
    port = free_port()
    server = start_metrics_server(port, metrics.registry, progress)
    assert server is not None
    try:
        url = f"http://127.0.0.1:{port}/progress"
        record = json.loads(urllib.request.urlopen(url, timeout=5).read())
    finally:
        server.close()
        del store
    assert record["step"] == 3
    assert record["inPlaceRestarts"] == [crash.model_dump(by_alias=True, exclude_none=True)]
