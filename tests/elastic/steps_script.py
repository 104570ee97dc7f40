"""A minimal elastic workload for launcher/store tests: all-reduce steps, resumable from a file.

Rank 0 appends ``<step> <world_size> <agent>`` to ``$OUT/steps.log`` after every step and keeps
the step count in ``$OUT/step`` so a restarted group continues where the last one stopped.
"""

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    out = Path(os.environ["OUT"])
    total = int(os.environ.get("STEPS", "40"))
    if os.environ.get("EXIT_CODE"):
        sys.exit(int(os.environ["EXIT_CODE"]))
    if os.environ.get("PERMANENT") and int(os.environ.get("LOCAL_RANK", 0)) == 0:
        Path(os.environ["TORCHKUBE_PERMANENT_ERROR_FILE"]).write_text("bad config: steps < 0\n")
        sys.exit(3)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    step_file = out / "step"
    step = int(step_file.read_text()) if step_file.exists() else 0
    while step < total:
        value = torch.ones(1)
        dist.all_reduce(value)
        assert int(value.item()) == world
        step += 1
        if rank == 0:
            step_file.write_text(str(step))
            with (out / "steps.log").open("a") as log:
                log.write(f"{step} {world} {os.environ.get('AGENT', '?')}\n")
        time.sleep(float(os.environ.get("STEP_SECONDS", "0.2")))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
