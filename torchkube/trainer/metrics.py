"""What the trainer tells the operator and Prometheus: metrics, ``progress.json``, ``/progress``.

No torch here. Metric names follow Prometheus practice (``torchkube_train_`` prefix, base
units, ``_total`` on counters, ratios 0–1) with two low-cardinality labels, ``job`` and
``rank``. One HTTP server per pod (on local rank 0) serves ``/metrics`` and ``/progress`` on
``TORCHKUBE_METRICS_PORT``; rank 0's numbers are the job's. ``/progress`` adds the job's
in-place restarts of workers from the rendezvous store (``torchkube.elastic.restarts``).
"""

import contextlib
import json
import logging
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

from torchkube.api.contract import PROGRESS_FILE, TERMINATION_LOG, Env, ProgressReport
from torchkube.api.times import rfc3339
from torchkube.elastic.restarts import RestartBoard
from torchkube.trainer.loader import EXIT_CONFIG_ERROR, RunEnv

log = logging.getLogger("torchkube.trainer")

ENV_PEAK_FLOPS = Env.PEAK_FLOPS

MatmulPrecision = Literal["bf16", "tf32", "fp32"]

# Dense peak FLOP/s of one device per matmul precision: bf16 and TF32 on the tensor (matrix)
# cores — half the datasheets' "with sparsity" figures — and fp32 without TF32. Vendor
# datasheets, cited in docs/trainer.md (MFU). Matched as substrings of
# torch.cuda.get_device_name(), most specific first.
PEAK_FLOPS: list[tuple[str, dict[MatmulPrecision, float]]] = [
    ("H100 NVL", {"bf16": 835.5e12, "tf32": 417.5e12, "fp32": 60e12}),
    ("H100 PCIe", {"bf16": 756e12, "tf32": 378e12, "fp32": 51e12}),
    ("H200 NVL", {"bf16": 835.5e12, "tf32": 417.5e12, "fp32": 60e12}),
    ("H200", {"bf16": 989e12, "tf32": 494.5e12, "fp32": 67e12}),  # SXM
    ("H100", {"bf16": 989e12, "tf32": 494.5e12, "fp32": 67e12}),  # SXM: "NVIDIA H100 80GB HBM3"
    ("B200", {"bf16": 2250e12, "tf32": 1100e12, "fp32": 75e12}),  # HGX B200, 1,000 W
    ("MI300X", {"bf16": 1307.4e12, "tf32": 653.7e12, "fp32": 163.4e12}),
    ("A100", {"bf16": 312e12, "tf32": 156e12, "fp32": 19.5e12}),
]


def peak_flops(device_name: str, precision: MatmulPrecision) -> float | None:
    """Peak FLOP/s of one device at the precision its matmuls run in, ``TORCHKUBE_PEAK_FLOPS``
    first; None when unknown (CPU), so that no made-up MFU is reported."""
    if os.environ.get(ENV_PEAK_FLOPS):
        return float(os.environ[ENV_PEAK_FLOPS])
    for pattern, peaks in PEAK_FLOPS:
        if pattern in device_name:
            return peaks[precision]
    return None


def write_json_atomic(path: Path, record: dict[str, Any]) -> None:
    """Write then rename, so a reader (the operator) never sees half a record."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, path)


def report_permanent_error(message: str, run_env: RunEnv | None = None) -> None:
    """Say why the job cannot run, everywhere the operator and a human look.

    One line on stderr; the line in ``$TORCHKUBE_PERMANENT_ERROR_FILE``, which tells
    ``torchkube.elastic.launch`` to stop torchrun instead of restarting the workers and to
    exit 3 (plain torchrun would exit 1); Kubernetes' termination message
    (``/dev/termination-log``); and on rank 0 an ``error`` / ``permanent`` entry in
    ``progress.json`` when the checkpoint folder is usable.
    """
    print(f"torchkube-trainer: error: {message}", file=sys.stderr, flush=True)
    if os.environ.get(Env.PERMANENT_ERROR_FILE):  # torchkube.elastic.launch stops torchrun
        with contextlib.suppress(OSError):
            Path(os.environ[Env.PERMANENT_ERROR_FILE]).write_text(message + "\n")
    env = run_env or RunEnv(
        checkpoint_dir=Path(os.environ[Env.CHECKPOINT_DIR])
        if os.environ.get(Env.CHECKPOINT_DIR)
        else None,
        rank=int(os.environ.get("RANK", "0") or 0),
    )
    log_path = env.termination_log or Path(
        os.environ.get(Env.TERMINATION_LOG, str(TERMINATION_LOG))
    )
    if log_path.exists():
        with contextlib.suppress(OSError):
            log_path.write_text(f"permanent error (exit {EXIT_CONFIG_ERROR}): {message}\n")
    if env.rank == 0 and env.checkpoint_dir is not None and env.checkpoint_dir.is_dir():
        path = env.checkpoint_dir / PROGRESS_FILE
        with contextlib.suppress(OSError, ValueError):
            known = ProgressReport.model_validate_json(path.read_text()) if path.exists() else None
            report = (known or ProgressReport()).model_copy(
                update={
                    "error": message,
                    "permanent": True,
                    "exit_code": int(EXIT_CONFIG_ERROR),
                    "updated": rfc3339(time.time()),
                }
            )
            write_json_atomic(path, report.to_wire())


class TrainMetrics:
    """The trainer's Prometheus metrics, on a registry of its own (no global state)."""

    def __init__(self, job: str, rank: int):
        self.registry = CollectorRegistry()
        labels = {"job": job, "rank": str(rank)}

        def gauge(name: str, doc: str) -> Any:
            return Gauge(name, doc, list(labels), registry=self.registry).labels(**labels)

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, list(labels), registry=self.registry).labels(**labels)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            return Histogram(
                name, doc, list(labels), registry=self.registry, buckets=buckets
            ).labels(**labels)

        seconds = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
        self.step = gauge("torchkube_train_step", "Last completed optimizer step.")
        self.total_steps = gauge("torchkube_train_total_steps", "Optimizer steps the job runs for.")
        self.loss = gauge("torchkube_train_loss", "Training loss, mean over ranks, last log step.")
        self.eval_loss = gauge("torchkube_train_eval_loss", "Evaluation loss, mean over ranks.")
        self.learning_rate = gauge("torchkube_train_learning_rate", "Current learning rate.")
        self.step_duration = histogram(
            "torchkube_train_step_duration_seconds", "Wall time of one optimizer step.", seconds
        )
        self.tokens = counter(
            "torchkube_train_tokens_total",
            "Training tokens this rank processed (a tensor group's: on its first rank only).",
        )
        self.tokens_per_second = gauge(
            "torchkube_train_tokens_per_second", "Job-wide training throughput, last log window."
        )
        self.mfu = gauge(
            "torchkube_train_mfu_ratio",
            "Model FLOPs utilisation (6N+12LHQT per token over the device's dense peak at the "
            "precision the matmuls run in: bf16, TF32 or fp32); NaN when the peak is unknown.",
        )
        self.data_wait = counter(
            "torchkube_train_data_wait_seconds_total", "Time the loop waited for input batches."
        )
        self.checkpoint_save = histogram(
            "torchkube_train_checkpoint_save_duration_seconds",
            "From the start of a checkpoint save until it is on disk.",
            seconds,
        )
        self.checkpoint_blocking = histogram(
            "torchkube_train_checkpoint_blocking_duration_seconds",
            "Part of a checkpoint save during which training was blocked.",
            seconds,
        )
        self.checkpoint_staging = gauge(
            "torchkube_train_checkpoint_staging_bytes",
            "Host memory this rank's async checkpoint staging buffers hold (kept between saves).",
        )
        self.checkpoint_load = gauge(
            "torchkube_train_checkpoint_load_duration_seconds", "Time the last resume took to load."
        )
        self.last_checkpoint_step = gauge(
            "torchkube_train_last_checkpoint_step", "Step of the newest committed checkpoint."
        )
        self.last_checkpoint_time = gauge(
            "torchkube_train_last_checkpoint_timestamp_seconds",
            "Unix time the newest checkpoint was committed.",
        )
        self.restarts = counter(
            "torchkube_train_restarts_total", "Worker-group restarts by this pod's torchrun agent."
        )
        self.resumes = counter(
            "torchkube_train_resumes_total", "Times this job resumed from a checkpoint."
        )
        self.last_step_time = gauge(
            "torchkube_train_last_step_timestamp_seconds",
            "Unix time this rank last finished a step (its heartbeat; a hang stops it).",
        )
        self.step_compute = gauge(
            "torchkube_train_step_compute_seconds",
            "This rank's compute time per step, last log window: the step less its wait for "
            "the other ranks (ddp and zero1 on CPU).",
        )
        self.step_wait = gauge(
            "torchkube_train_step_wait_seconds",
            "This rank's wait per step for the other ranks in the gradient all-reduce, last "
            "log window (ddp and zero1 on CPU).",
        )
        self.slowest_rank = gauge(
            "torchkube_train_slowest_rank",
            "The rank with the longest compute time per step, last log window (rank 0 only).",
        )
        self.slowest_slowdown = gauge(
            "torchkube_train_slowest_rank_slowdown",
            "The slowest rank's compute time per step over the other ranks' median (rank 0).",
        )
        self.world_size = gauge("torchkube_train_world_size", "Processes in the current job.")
        self.data_parallel_size = gauge(
            "torchkube_train_data_parallel_size",
            "Data-parallel ranks of the device mesh: the ways the global batch is split.",
        )
        self.tensor_parallel_size = gauge(
            "torchkube_train_tensor_parallel_size",
            "Tensor-parallel ranks of the device mesh: processes of one pod that split each layer.",
        )
        self.grad_accum_steps = gauge(
            "torchkube_train_grad_accumulation_steps", "Micro-steps per optimizer step."
        )
        self.global_batch = gauge(
            "torchkube_train_global_batch_sequences", "Sequences per optimizer step, all ranks."
        )


class ProgressReporter:
    """Rank 0's progress record: ``<checkpoint_dir>/progress.json`` and ``GET /progress``.

    Written at every log step and at least every ``min_interval`` seconds when anything
    changed, atomically, so the operator can poll it from the volume or over HTTP.
    """

    def __init__(self, folder: Path | None, enabled: bool, min_interval: float = 5.0):
        self.path = folder / PROGRESS_FILE if folder is not None else None
        self.enabled = enabled
        self.min_interval = min_interval
        self._report = ProgressReport()
        self._written = 0.0
        self._lock = threading.Lock()

    @property
    def record(self) -> dict[str, Any]:
        """The report in its wire form (the contract's :class:`ProgressReport`)."""
        with self._lock:
            return self._report.to_wire()

    def update(self, force: bool = False, **fields: Any) -> None:
        """Merge ``fields`` (ProgressReport's field names) into the report; write it when
        forced or the interval has passed."""
        unknown = set(fields) - set(ProgressReport.model_fields)
        if unknown:
            raise TypeError(f"not ProgressReport fields: {sorted(unknown)}")
        now = time.time()
        with self._lock:
            self._report = self._report.model_copy(update={**fields, "updated": rfc3339(now)})
            record = self._report.to_wire()
        if not (self.enabled and self.path is not None):
            return
        if force or now - self._written >= self.min_interval:
            try:
                write_json_atomic(self.path, record)
                self._written = now
            except OSError as e:  # progress is advisory; never fail training over it
                log.warning("could not write %s: %s", self.path, e)


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
worker that fails (a dead peer) closes the server before it exits: socketserver's default
half second was up to half a second more before the launcher saw the failure."""


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
