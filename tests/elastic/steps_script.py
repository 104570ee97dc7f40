"""A minimal elastic workload for launcher/store tests: all-reduce steps, resumable from a file.

It beats its heartbeat after every step, as the trainer does (the launcher's hang watchdog
reads it). Every worker writes its global rank to ``$OUT/rank-<agent>-<local rank>``. Rank 0
appends ``<step> <world_size> <agent>`` to ``$OUT/steps.log`` after every step, in one
``write`` so a worker killed mid-step leaves either the whole line or none; a restarted group
continues after the last line. (Keeping the count in a second file raced: a
worker stopped between the two writes lost a step.) With ``CRASH_AT_STEP``, rank 0 exits
``CRASH_EXIT_CODE`` at that step, once. With ``TERM_SECONDS``, a worker sent SIGTERM
touches ``$OUT/terminating-<agent>`` and takes that long to exit, as the trainer's emergency
checkpoint does, then touches ``$OUT/terminated-<agent>`` as it exits.
"""

import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from torchkube.elastic.heartbeat import Heartbeat

CRASH_EXIT_CODE = 7


def _checkpoint_on_sigterm(out: Path, seconds: float) -> None:
    def checkpoint(*_: object) -> None:
        (out / f"terminating-{os.environ.get('AGENT', '?')}").touch()
        time.sleep(seconds)
        (out / f"terminated-{os.environ.get('AGENT', '?')}").touch()
        os._exit(128 + signal.SIGTERM)

    signal.signal(signal.SIGTERM, checkpoint)


def main() -> None:
    out = Path(os.environ["OUT"])
    if os.environ.get("TERM_SECONDS"):
        _checkpoint_on_sigterm(out, float(os.environ["TERM_SECONDS"]))
    total = int(os.environ.get("STEPS", "40"))
    if os.environ.get("EXIT_CODE"):
        sys.exit(int(os.environ["EXIT_CODE"]))
    if os.environ.get("PERMANENT") and int(os.environ.get("LOCAL_RANK", 0)) == 0:
        Path(os.environ["TORCHKUBE_PERMANENT_ERROR_FILE"]).write_text("bad config: steps < 0\n")
        sys.exit(3)
    dist.init_process_group("gloo")
    heartbeat = Heartbeat.from_env()
    rank, world = dist.get_rank(), dist.get_world_size()
    agent, local_rank = os.environ.get("AGENT", "?"), os.environ["LOCAL_RANK"]
    (out / f"rank-{agent}-{local_rank}").write_text(f"{rank}\n")
    log_path = out / "steps.log"
    lines = log_path.read_text().split() if log_path.exists() else []
    step = int(lines[-3]) if lines else 0
    heartbeat.training()
    crash_at = int(os.environ["CRASH_AT_STEP"]) if "CRASH_AT_STEP" in os.environ else None
    crashed = out / "crashed"
    while step < total:
        if step == crash_at and rank == 0 and not crashed.exists():
            crashed.touch()
            sys.exit(CRASH_EXIT_CODE)  # once: torchrun restarts the workers in place
        value = torch.ones(1)
        dist.all_reduce(value)
        assert int(value.item()) == world
        step += 1
        heartbeat.beat(step)
        if rank == 0:
            with log_path.open("a", buffering=1) as log:
                log.write(f"{step} {world} {os.environ.get('AGENT', '?')}\n")
        time.sleep(float(os.environ.get("STEP_SECONDS", "0.2")))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
