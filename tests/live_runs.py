"""``torchkube run`` of examples/live-recovery.yaml with three replica groups and kills aimed
inside phases (``Chaos.in_phases``), as the local live-recovery tests run it: the one place
that sets the job up and gathers what a failed assertion should show."""

import io
from dataclasses import dataclass
from pathlib import Path

import yaml

from torchkube.api import TrainingJob
from torchkube.local.display import Summary
from torchkube.local.runner import Chaos, LocalRun

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "live-recovery.yaml"
MICRO_BATCH_SECONDS = 0.1
"""Each micro-batch stretched to this: a step of 0.1-0.3 s (three groups to one), so that
training lasts through the replacements' start-ups."""


@dataclass
class LiveRun:
    run: LocalRun
    summary: Summary
    out: str
    logs: dict[str, str]
    """Each worker's log by file name."""
    shown: str
    """The run's output and each worker log's tail, for an assertion's message."""


def three_groups(
    tmp_path: Path, steps: int, chaos: Chaos, from_step: int, checkpoint_interval: int | None = None
) -> LiveRun:
    """Three groups training ``steps`` steps of 12 sequences; the phases armed from step
    ``from_step`` on; a checkpoint every ``checkpoint_interval`` steps (else the example's)."""
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["spec"]["replicas"] = {"min": 1, "max": 3}
    if checkpoint_interval is not None:
        manifest["spec"]["checkpoint"]["intervalSteps"] = checkpoint_interval
    manifest["spec"]["trainer"] |= {"steps": steps, "globalBatchSize": 12, "warmupSteps": 5}
    chaos.in_phases_from_step, chaos.compute_seconds = from_step, MICRO_BATCH_SECONDS
    out = io.StringIO()
    run = LocalRun(TrainingJob.model_validate(manifest), tmp_path, chaos=chaos, out=out)
    summary = run.run()
    logs = {p.name: p.read_text() for p in (tmp_path / "logs").glob("worker-*.log")}
    shown = out.getvalue()[-4000:] + "".join(
        f"\n--- {name}\n{text[-2500:]}" for name, text in sorted(logs.items())
    )
    return LiveRun(run, summary, out.getvalue(), logs, shown)
