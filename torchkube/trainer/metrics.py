"""The trainer's Prometheus metrics.

No torch here. Metric names follow Prometheus practice (``torchkube_train_`` prefix, base
units, ``_total`` on counters, ratios 0–1) with two low-cardinality labels, ``job`` and
``rank``; rank 0's numbers are the job's. ``torchkube.trainer.server`` serves them.
"""

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


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
