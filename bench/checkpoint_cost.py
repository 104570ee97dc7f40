"""Checkpoint cost: how long training is blocked by an async vs a synchronous DCP save of the
same state, save and load throughput, and the time to resume from a checkpoint.

Run: ``python -m bench.checkpoint_cost`` (≈ 8 min on 2 cores; ``--model small`` for a smoke run).

The state is the GPT-2 small shape (124M parameters with GPT-2's 50257-token vocabulary) on
CPU, fp32, after one AdamW step: model + two Adam moments ≈ 1.5 GB, written by the trainer's
own ``CheckpointManager`` (``torch.distributed.checkpoint``, two writer threads, fsync, the
marker and rename commit) into a folder on this machine's disk.

- **sync blocking**: ``save()`` with ``checkpoint.mode: sync`` — training waits for all of it.
- **async blocking**: ``save()`` with ``checkpoint.mode: async`` — training waits while the
  state is copied to host buffers (kept between saves, as in a run; the first save also
  allocates them and is reported apart); the write runs on a background thread. Also
  measured: how much longer the training steps that overlap the background write take than
  steps without one (on 2 cores the writer competes with training for the same CPUs).
- Sync and async saves alternate, and the ratio is taken pair by pair.
- **save / load throughput**: checkpoint bytes on disk ÷ sync save time, and ÷ the load time
  (``CheckpointManager.load``) with the checkpoint's pages evicted from the page cache first
  (``posix_fadvise(DONTNEED)`` on its files only) — "cold", as after a node move — and warm.
- **emergency save** (SIGTERM, ``CheckpointManager.save_on_stop``): from the stop to the
  committed checkpoint, with no save in flight (one synchronous write of the step) and with
  an async save of the previous step just started (that save finished and committed, nothing
  more written). For comparison, the same situation handled as before issue #16: the save in
  flight waited for, then the step written again synchronously (``save(blocking=True)``,
  which the last step of a run still uses). Held against Kubernetes' default
  ``terminationGracePeriodSeconds`` (TrainingJob default 120 s) in docs/trainer.md.
- **resume**: ``python -m torchkube.trainer`` started on a folder holding a checkpoint →
  its first training step; against the same process started on an empty folder, so the
  difference is what resuming costs. The split (start-up, load, first step) is read from the
  trainer's log.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import Figure, Results, Target, command_line, load_average, log, median
from torchkube.api.contract import Env

TARGET_BLOCKING_RATIO = 10.0  # async blocking ≤ 10 % of a synchronous save
GPT2_VOCAB = 50257


def spec_for(args: argparse.Namespace, steps: int) -> Any:
    from torchkube.api.trainer import TrainerSpec

    return TrainerSpec.model_validate(
        {
            "model": args.model,
            "vocabSize": GPT2_VOCAB,
            "device": "cpu",
            "strategy": "ddp",
            "microBatchSize": 1,
            "globalBatchSize": 1,
            "seqLen": args.seq_len,
            "steps": steps,
            "warmupSteps": 0,
            "logIntervalSteps": 1,
        }
    )


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def evict(path: Path) -> None:
    """Drop a checkpoint's pages from the page cache (only its files; nobody else's)."""
    for p in path.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


class State:
    """Model, optimizer, schedule and train state after one step, plus a way to train on."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch
        from torch.optim.lr_scheduler import LambdaLR

        from torchkube.trainer import distributed
        from torchkube.trainer.checkpoint import TrainState
        from torchkube.trainer.data import TokenDataset
        from torchkube.trainer.parallel import build_optimizer, lr_lambda, parallelize
        from torchkube.trainer.workload import data_paths, gpt_workload

        self.spec = spec_for(args, steps=1000)
        self.info = distributed.setup(self.spec)
        workload = gpt_workload()
        torch.manual_seed(self.spec.seed)
        model = workload.build_model(self.spec)
        self.model = parallelize(model, self.spec, self.info, workload.blocks(model))
        self.optimizer = build_optimizer(self.model, self.spec, self.info)
        self.scheduler = LambdaLR(self.optimizer, lr_lambda(self.spec))
        self.train_state = TrainState()
        self.loss_fn = workload.loss_fn
        self.data = TokenDataset(data_paths(self.spec)[0], self.spec.seq_len)
        self.params = sum(p.numel() for p in model.parameters())
        self.step()

    def step(self) -> float:
        """One training step; returns its wall time."""
        from torch.utils.data import default_collate

        started = time.perf_counter()
        index = self.train_state.step % len(self.data)
        x, y = default_collate([self.data[index]])
        loss = self.loss_fn(self.model, (x, y))
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.train_state.step += 1
        return time.perf_counter() - started

    def manager(self, folder: Path, async_save: bool) -> Any:
        from torchkube.trainer.checkpoint import CheckpointManager

        manager = CheckpointManager(
            folder,
            self.info,
            self.model,
            self.optimizer,
            self.scheduler,
            self.train_state,
            strategy="ddp",
            interval_steps=0,
            interval_seconds=0,
            keep=2,
            async_save=async_save,
        )
        manager.claim()
        return manager


def resume_trial(args: argparse.Namespace, folder: Path, steps: int) -> dict[str, float]:
    """Start the trainer as a pod would; seconds from process start to its milestones."""
    env = {
        **os.environ,
        Env.CHECKPOINT_DIR: str(folder),
        Env.CHECKPOINT_INTERVAL_STEPS: str(steps),
        Env.METRICS_PORT: "0",
        "OMP_NUM_THREADS": str(os.cpu_count() or 1),
    }
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    env[Env.TRAINER_CONFIG] = json.dumps(spec_for(args, steps).to_wire())
    started = time.time()
    result = subprocess.run(
        [sys.executable, "-m", "torchkube.trainer"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if result.returncode != 0:
        raise RuntimeError(f"trainer failed ({result.returncode}):\n{result.stderr[-3000:]}")
    from bench.recovery_e2e import line_time

    year = time.localtime(started).tm_year
    out: dict[str, float] = {}
    for line in result.stderr.splitlines():
        at = line_time(line, year)
        if at is None:
            continue
        loaded = re.search(r"resumed from \S+ .* in ([0-9.]+)s", line)
        if loaded and "loaded" not in out:
            out["loaded"] = at - started
            out["load"] = float(loaded.group(1))
        if re.search(r"torchkube: step \d+/\d+ \|", line) and "first_step" not in out:
            out["first_step"] = at - started
    if "first_step" not in out:
        raise RuntimeError(f"no training step in the trainer's log:\n{result.stderr[-3000:]}")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.checkpoint_cost", description=__doc__)
    parser.add_argument("--model", default="gpt2", help="GPT preset (vocabulary: GPT-2's)")
    parser.add_argument("--seq-len", type=int, default=64, help="short: steps are not timed")
    parser.add_argument("--trials", type=int, default=5, help="(sync, async) save pairs")
    parser.add_argument("--load-trials", type=int, default=3)
    parser.add_argument("--resume-trials", type=int, default=3)
    parser.add_argument("--dir", type=Path, help="where checkpoints go (default: a temp dir)")
    args = parser.parse_args(argv)

    import torch

    base = Path(tempfile.mkdtemp(prefix="torchkube-bench-ckpt-", dir=args.dir))
    results = Results(
        "checkpoint_cost",
        command_line("bench.checkpoint_cost", argv),
        config={**vars(args), "dir": str(args.dir) if args.dir else None},
    )
    results.machine["torch"] = torch.__version__
    results.machine["torch_threads"] = torch.get_num_threads()
    try:
        run(args, base, results)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    results.write()


def emergency(state: State, manager: Any, idle: Figure, busy: Figure, before: Figure) -> None:
    """The three emergency-save figures of one trial (see the module docstring)."""
    load = load_average()
    started = time.perf_counter()
    manager.save_on_stop(state.train_state.step)  # nothing in flight: one synchronous write
    idle.add(time.perf_counter() - started, load)
    for figure, stop in ((busy, manager.save_on_stop), (before, _save_and_wait(manager))):
        state.step()
        manager.save(state.train_state.step)  # the interval save, still being written...
        state.step()  # ...when the stop comes at the end of the next step
        started = time.perf_counter()
        stop(state.train_state.step)
        figure.add(time.perf_counter() - started, load)
    log(
        f"emergency save: {idle.values[-1]:.2f}s with nothing in flight, "
        f"{busy.values[-1]:.2f}s with a save in flight ({before.values[-1]:.2f}s as before)"
    )


def _save_and_wait(manager: Any) -> Any:
    def stop(step: int) -> None:
        manager.save(step, blocking=True)

    return stop


def run(args: argparse.Namespace, base: Path, results: Results) -> None:
    from torchkube.trainer import distributed
    from torchkube.trainer.checkpoint import step_folders

    state = State(args)
    sync_dir, async_dir = base / "sync", base / "async"
    sync_mgr = state.manager(sync_dir, async_save=False)
    async_mgr = state.manager(async_dir, async_save=True)

    sync_block = results.figure("sync save: training blocked", "s")
    async_first = results.figure("async save: training blocked, first save", "s")
    async_block = results.figure("async save: training blocked (buffers reused)", "s")
    ratio = results.figure(
        "async blocking ÷ sync blocking", "%", target=Target(TARGET_BLOCKING_RATIO)
    )
    background = results.figure("async save: whole save, nothing else running", "s")
    slowdown = results.figure("async save: extra step time while the write runs", "s")
    stop_idle = results.figure("emergency save, nothing in flight", "s")
    stop_busy = results.figure("emergency save, an async save of the step before in flight", "s")
    stop_before = results.figure(
        "emergency save, same situation, as before issue #16 (wait, then write again)", "s"
    )
    save_mbps = results.figure("save throughput (sync)", "MB/s")
    load_cold = results.figure("load throughput, evicted from page cache", "MB/s")
    load_warm = results.figure("load throughput, page cache warm", "MB/s")
    load_time = results.figure("load time, evicted from page cache", "s")
    resume = results.figure("resume: process start → first step, from a checkpoint", "s")
    fresh = results.figure("fresh start: process start → first step, no checkpoint", "s")
    resume_setup = results.figure("resume: start-up before the load", "s")
    resume_load = results.figure("resume: checkpoint load (trainer's log)", "s")
    resume_step = results.figure("resume: load → first step", "s")

    baseline = median([state.step() for _ in range(5)])
    log(f"{state.params / 1e6:.1f}M parameters; a training step takes {baseline:.2f}s")
    size = 0
    for trial in range(args.trials + 1):  # +1: the first async save allocates its buffers
        step = state.train_state.step
        load = load_average()
        started = time.perf_counter()
        sync_mgr.save(step)
        sync_seconds = time.perf_counter() - started
        size = folder_bytes(step_folders(sync_dir)[0][1])

        state.step()
        step = state.train_state.step
        started = time.perf_counter()
        async_mgr.save(step)
        blocked = time.perf_counter() - started
        overlapped, extra = 0, 0.0
        while async_mgr.last_step != step:  # train on, as the trainer does, polling per step
            extra += state.step() - baseline
            overlapped += 1
            async_mgr.poll()
        # The same save once more with nothing competing: how long the whole write takes.
        state.step()
        started = time.perf_counter()
        async_mgr.save(state.train_state.step)
        async_mgr.wait()
        total = time.perf_counter() - started
        log(
            f"pair {trial + 1}: sync {sync_seconds:.2f}s ({size / 1e6:.0f} MB); async blocked "
            f"{blocked:.3f}s, {overlapped} steps overlapped the write (+{extra:.2f}s); a whole "
            f"async save alone {total:.2f}s"
        )
        if trial == 0:
            async_first.add(blocked, load)
        else:
            async_block.add(blocked, load)
            ratio.add(100 * blocked / sync_seconds, load)
            background.add(total, load)
            slowdown.add(extra, load)
        sync_block.add(sync_seconds, load)
        save_mbps.add(size / 1e6 / sync_seconds, load)
        state.step()
        if trial:
            emergency(state, async_mgr, stop_idle, stop_busy, stop_before)

    newest = step_folders(sync_dir)[0][1]
    for trial in range(args.load_trials):
        for cold in (True, False):
            if cold:
                evict(newest)
            load = load_average()
            started = time.perf_counter()
            assert sync_mgr.load(), "the checkpoint did not load"
            seconds = time.perf_counter() - started
            (load_cold if cold else load_warm).add(size / 1e6 / seconds, load)
            if cold:
                load_time.add(seconds, load)
            log(f"load {trial + 1} ({'evicted' if cold else 'warm'}): {seconds:.2f}s")
    distributed.teardown()

    resume_dir = base / "resume"
    first = resume_trial(args, resume_dir, steps=2)  # writes step-2 (and leaves it)
    log(f"checkpoint for the resume runs written ({first['first_step']:.1f}s to first step)")
    for trial in range(args.resume_trials):
        for_resume = base / f"resume-{trial}"
        shutil.copytree(resume_dir, for_resume)
        for folder in for_resume.glob("step-*"):
            evict(folder)
        load = load_average()
        resumed = resume_trial(args, for_resume, steps=3)
        shutil.rmtree(for_resume, ignore_errors=True)
        scratch = base / f"fresh-{trial}"
        from_scratch = resume_trial(args, scratch, steps=1)
        shutil.rmtree(scratch, ignore_errors=True)
        if "load" not in resumed:
            raise RuntimeError("the trainer did not resume from the checkpoint")
        resume.add(resumed["first_step"], load)
        resume_setup.add(resumed["loaded"] - resumed["load"], load)
        resume_load.add(resumed["load"], load)
        resume_step.add(resumed["first_step"] - resumed["loaded"], load)
        fresh.add(from_scratch["first_step"], load_average())
        log(
            f"resume {trial + 1}: first step {resumed['first_step']:.2f}s after start "
            f"(load {resumed['load']:.2f}s); fresh start {from_scratch['first_step']:.2f}s"
        )
    results.extra |= {"checkpoint_bytes": size, "parameters": state.params, "step_s": baseline}
    results.notes += [
        f"state: {args.model} preset with GPT-2's vocabulary, {state.params / 1e6:.1f}M "
        f"parameters, fp32 on CPU, AdamW after one step: {size / 1e6:.0f} MB on disk",
        "disk: a temporary folder on this machine's local disk (ext4 on a virtual disk; "
        "--dir picks another); every DCP file is fsynced",
        "blocking = wall time of CheckpointManager.save() in the training thread; for sync it "
        "includes the commit (marker, rename, directory fsync)",
        f"a training step (sequence {args.seq_len}, batch 1) takes {baseline:.2f}s without a "
        "save in flight; 'extra step time' is the sum over the steps that overlapped the "
        "background write of (step time − that)",
    ]


if __name__ == "__main__":
    main()
