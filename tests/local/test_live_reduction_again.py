"""A replica group lost mid-step, after its peers computed their gradients: the survivors'
reduction fails, and they finish that step in their next quorum with the gradients they
already have, instead of computing it again.

Three replica groups; from step KILL_FROM a kill is aimed at the ``reducing`` phase (the first
process to reach its cross-group reduction holds there until its worker is SIGKILLed), so the
other two are inside theirs, waiting for it, when it dies.
"""

import io
import json
import re
from pathlib import Path

import pytest
import yaml

from torchkube.api import TrainingJob
from torchkube.api.contract import ChaosPhase
from torchkube.local.runner import Chaos, LocalRun

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "live-recovery.yaml"
STEPS, KILL_FROM = 80, 20
MICRO_BATCH_SECONDS = 0.1
"""A step of 0.1-0.3 s (three groups to one): training lasts through the replacement's start."""
pytestmark = pytest.mark.slow


def test_a_group_lost_mid_step_costs_its_peers_no_recomputed_step(tmp_path: Path) -> None:
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["spec"]["replicas"] = {"min": 1, "max": 3}
    manifest["spec"]["trainer"] |= {"steps": STEPS, "globalBatchSize": 12, "warmupSteps": 5}
    chaos = Chaos(in_phases=[ChaosPhase.REDUCING])
    chaos.in_phases_from_step, chaos.compute_seconds = KILL_FROM, MICRO_BATCH_SECONDS
    out = io.StringIO()
    run = LocalRun(TrainingJob.model_validate(manifest), tmp_path, chaos=chaos, out=out)
    summary = run.run()
    logs = {p.name: p.read_text() for p in (tmp_path / "logs").glob("worker-*.log")}
    shown = out.getvalue()[-4000:] + "".join(
        f"\n--- {name}\n{text[-2500:]}" for name, text in sorted(logs.items())
    )
    assert summary.succeeded and summary.steps == STEPS, shown
    assert run.phase_kills == [ChaosPhase.REDUCING], shown
    assert summary.replica_group_losses == 1 and summary.restarts == 0, shown

    # both survivors lost the vote on the step the victim held in, then committed it in
    # their next quorum, of the two of them, without computing it again
    victim = next(name for name, text in logs.items() if "holding while reducing" in text)
    survivors = {name: text for name, text in logs.items() if name != victim}
    assert len(survivors) == 2, sorted(logs)
    finished = []
    for name, text in survivors.items():
        lost = re.findall(r"live: step (\d+) not committed .*: its reduction is done again", text)
        done = re.findall(r"live: step (\d+) committed among 2 replica groups without", text)
        assert lost and done and lost[0] == done[0], f"{name}: {lost} {done}\n{shown}"
        finished.append(int(done[0]))
        steps = [int(s) for s in re.findall(r"step (\d+)/\d+ \|", text)]
        assert steps == sorted(set(steps)), f"{name}: a step counted twice: {steps}"
        assert "resumed from" not in text, shown
    assert finished[0] == finished[1], finished

    final = json.loads((tmp_path / "checkpoints" / "progress.json").read_text())
    assert final["finished"] and final["step"] == STEPS, final
    assert final["live"]["stepsFinishedAmongSurvivors"] >= 1, final["live"]
