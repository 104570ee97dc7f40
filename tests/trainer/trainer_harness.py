"""Helpers for the trainer tests: the tiny-model recipe and real torchrun launches.

Every multi-process test drives ``python -m torch.distributed.run`` exactly as a pod does and
watches ``progress.json`` — the same file the operator reads.
"""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The recipe every trainer test shares: a tiny GPT on the sample corpus, CPU, constant LR so
# a run split into several launches with different ``--steps`` is the same run.
TINY = {
    "model": "tiny",
    "device": "cpu",
    "seqLen": 64,
    "microBatchSize": 4,
    "globalBatchSize": 16,
    "learningRate": 3e-3,
    "lrSchedule": "constant",
    "warmupSteps": 5,
    "logIntervalSteps": 5,
    "deterministic": True,
    "collectiveTimeoutSeconds": 60,
}


def spec_args(data: Path, **overrides: Any) -> list[str]:
    """The TINY recipe as ``--field=value`` flags, with overrides (None drops a field)."""
    values = {**TINY, "dataPath": str(data / "train.bin"), **overrides}
    return [f"--{k}={v}" for k, v in values.items() if v is not None]


def worker_env(**extra: str) -> dict[str, str]:
    """Environment of a launched trainer: one thread per process (2 cores, several processes)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHKUBE_", "TORCHELASTIC"))}
    # A fresh worker store per rendezvous round, as torchkube.elastic.launch sets it: with
    # torchrun's shared store, restarted workers can read the previous round's addresses.
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    env.update(extra)
    return env


def read_progress(checkpoint_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((checkpoint_dir / "progress.json").read_text())
    except (OSError, ValueError):
        return {}


@dataclass
class Launch:
    """One torchrun agent (plus its workers) in a process group of its own."""

    proc: subprocess.Popen
    log: Path
    started: float = field(default_factory=time.monotonic)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"timed out after {timeout}s:\n{self.output()[-4000:]}") from None

    def signal(self, sig: int) -> None:
        """Signal the agent alone (torchrun forwards SIGTERM to its workers)."""
        self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL the agent and every worker: what losing a pod or node looks like.

        torchrun starts each worker in a session of its own, so killing the agent's process
        group alone would leave the workers training, which a dead pod never does.
        """
        victims = [self.proc.pid, *_descendants(self.proc.pid)]
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(30)

    def workers(self) -> dict[int, int]:
        """RANK → pid of the agent's live worker processes."""
        out = {}
        for pid, parent in _parents().items():
            if parent != self.proc.pid:
                continue
            with contextlib.suppress(OSError):
                for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    if item.startswith(b"RANK="):
                        out[int(item[5:])] = pid
        return out


def _parents() -> dict[int, int]:
    """pid → parent pid of every live process."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            out[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
    return out


def _descendants(pid: int) -> list[int]:
    parents = _parents()
    found, frontier = [], [pid]
    while frontier:
        children = [p for p, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def _lower_priority() -> None:
    """Workers yield to the test process, so it sees progress in time on a busy machine."""
    os.nice(5)


class Torchrun:
    """Starts torchrun agents for a test and kills whatever is left when it ends."""

    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.launches: list[Launch] = []

    def start(
        self,
        nproc: int,
        args: list[str],
        *,
        checkpoint_dir: Path,
        name: str = "run",
        rdzv: list[str] | None = None,
        max_restarts: int = 0,
        env: dict[str, str] | None = None,
    ) -> Launch:
        rdzv = rdzv or ["--standalone"]
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            *rdzv,
            f"--nproc-per-node={nproc}",
            f"--max-restarts={max_restarts}",
            "--monitor-interval=0.2",
            "-m",
            "torchkube.trainer",
            *args,
        ]
        log = self.tmp_path / f"{name}-{len(self.launches)}.log"
        proc = subprocess.Popen(
            cmd,
            preexec_fn=_lower_priority,
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=worker_env(TORCHKUBE_CHECKPOINT_DIR=str(checkpoint_dir), **(env or {})),
        )
        launch = Launch(proc, log)
        self.launches.append(launch)
        return launch

    def close(self) -> None:
        for launch in self.launches:
            if launch.proc.poll() is None:
                launch.kill()


def wait_for(
    predicate: Callable[[], Any],
    timeout: float,
    what: str,
    launches: list[Launch] = (),  # type: ignore[assignment]
) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail with the launch logs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        for launch in launches:
            if launch.proc.poll() is not None:
                raise AssertionError(
                    f"agent exited ({launch.proc.returncode}) while waiting "
                    f"for {what}:\n{launch.output()[-4000:]}"
                )
        time.sleep(0.1)
    logs = "\n".join(launch.output()[-3000:] for launch in launches)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{logs}")


def checkpoint_state(folder: Path) -> dict[str, Any]:
    """A committed checkpoint as the nested dict it was saved from (DCP's own converter)."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = folder.parent / f".{folder.name}.pt"
    dcp_to_torch_save(folder, out)
    state = torch.load(out, weights_only=False)
    out.unlink()
    return dict(state)


def checkpoint_tensors(folder: Path) -> dict[str, Any]:
    """A committed checkpoint as one flat dict without the RNG streams, for comparisons."""
    state = checkpoint_state(folder)
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            flat[prefix] = value

    walk("", {k: v for k, v in state.items() if k != "rng"})
    return flat


def logged_losses(log: str, kind: str = "loss") -> dict[int, float]:
    """Step → loss (or ``eval loss``) from rank 0's progress lines, as printed (4 decimals)."""
    found = {}
    for match in re.finditer(rf"torchkube: step (\d+)(?:/\d+)? \| {kind} ([0-9.]+)", log):
        found[int(match.group(1))] = float(match.group(2))
    return found


def staged_mib(log: str) -> float:
    """What rank 0 logged as the largest rank's async staging memory."""
    match = re.search(r"async checkpoints stage ([0-9.]+) MiB of host memory per rank", log)
    assert match, "no staging line in the log"
    return float(match.group(1))


def checkpoint_mib(folder: Path) -> float:
    """Tensor bytes of a checkpoint without the per-rank RNG streams: the job's whole state."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    entries = dcp.FileSystemReader(folder).read_metadata().state_dict_metadata
    total = sum(
        m.size.numel() * m.properties.dtype.itemsize
        for key, m in entries.items()
        if isinstance(m, TensorStorageMetadata) and not key.startswith("rng.")
    )
    return total / 2**20


def assert_bitwise_equal(a: dict[str, Any], b: dict[str, Any]) -> None:
    import torch

    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    for key, value in a.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, b[key]), f"{key} differs"
        elif key.startswith("train.") and key.split(".")[-1] in ("resumes", "world_size"):
            continue  # how the run got there, not where it is
        else:
            assert value == b[key], f"{key}: {value!r} != {b[key]!r}"


def relative_error(ours: Any, theirs: Any) -> float:
    """‖ours − theirs‖ / ‖theirs‖ in fp32: how far our logits or loss are from the oracle's."""
    return float((ours.float() - theirs.float()).norm() / theirs.float().norm())
