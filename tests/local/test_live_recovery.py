"""``torchkube run`` with ``failurePolicy.recovery: live``: a SIGKILLed worker costs the other
one step, not a restart, and its replacement joins from the live peer.

Real processes throughout: torchft's Lighthouse, two torchrun agents each with one trainer (a
torchft replica group), the trainer on CPU over gloo. Worker 1 is killed; worker 0 (quorum
rank 0, so the writer of the progress record all along) must train on without restarting,
and worker 1, started again, must copy the live state from it and train to the end.
"""

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "live-recovery.yaml"
KILL_AT = 60
pytestmark = pytest.mark.slow


def test_a_lost_worker_costs_the_other_one_step_and_rejoins_from_it(tmp_path: Path) -> None:
    cli = [sys.executable, "-m", "torchkube.cli", "run", str(EXAMPLE), "--fresh"]
    chaos = ["--chaos-at-step", str(KILL_AT), "--chaos-worker", "1"]
    result = subprocess.run(
        [*cli, "--workdir", str(tmp_path), *chaos], capture_output=True, text=True, timeout=600
    )
    logs = {p.name: p.read_text() for p in (tmp_path / "logs").glob("*.log")}
    shown = "\n".join(f"--- {name}\n{text[-3000:]}" for name, text in sorted(logs.items()))
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{shown}"
    final = json.loads((tmp_path / "checkpoints" / "progress.json").read_text())
    survivor, replacement = logs["worker-0.log"], logs["worker-1.log"]

    # the final step count is exact, and the survivor's progress says what happened
    assert final["finished"] and final["step"] == 600, final
    live = final["live"]
    assert live["replicaGroups"] == 2 and live["quorumChanges"] >= 2, live
    assert live["discardedSteps"] <= 1, live
    assert "chaos: SIGKILL worker 1" in result.stdout
    assert "the others trained on without a restart (recovery live)" in result.stdout

    # no step computed twice: the survivor never restarted nor reloaded, and its step counter
    # only went up
    assert "restarting the workers in place" not in survivor, shown
    assert "resumed from" not in survivor, shown
    steps = [int(s) for s in re.findall(r"step (\d+)/600 \|", survivor)]
    assert steps == sorted(set(steps)) and steps[-1] == 600, steps
    shrank = re.search(r"quorum changed from 2 to 1 replica groups at step (\d+)", survivor)
    assert shrank and int(shrank[1]) >= KILL_AT, shown

    # the survivors' longest step: failure detection (the Lighthouse's 2 s heartbeat timeout)
    # and a discarded attempt, bounded with room for a loaded CI machine
    assert live["longestStepSeconds"] < 10, live
    # torchft's own per-step cost is summed for the benchmark (bench/live_recovery.py)
    timed = live["stepTime"]
    assert timed["steps"] > 500 and 0 < timed["quorumSeconds"] < timed["stepSeconds"], timed
    assert timed["commitSeconds"] > 0 and timed["allreduceSeconds"] > 0, timed

    # the replacement copied the live state at a step after the kill, then trained to the end
    joined = re.findall(r"joined from a live peer: copied .* of step (\d+)", replacement)
    assert joined and int(joined[-1]) > int(shrank[1]), shown
    assert "finished: 600 steps" in replacement, shown


def test_sigterm_stops_a_live_job_on_a_checkpoint_of_its_last_step_and_it_resumes_there(
    tmp_path: Path,
) -> None:
    """A suspension or a Kueue preemption stops every group at once: the writer group writes
    the emergency checkpoint of the last committed step, so the job resumes there (before,
    the live loop ignored SIGTERM's request and the job fell back to its newest interval
    checkpoint, redoing every step since)."""
    cli = [sys.executable, "-m", "torchkube.cli", "run", str(EXAMPLE), "--workdir", str(tmp_path)]
    proc = subprocess.Popen([*cli, "--fresh"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    progress = tmp_path / "checkpoints" / "progress.json"
    deadline = time.monotonic() + 300
    while not (progress.exists() and json.loads(progress.read_text() or "{}").get("step", 0) > 130):
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise AssertionError(f"training never passed step 130: {proc.communicate()[0]!r}")
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=180)[0].decode()
    tails = "\n".join(p.read_text()[-3000:] for p in (tmp_path / "logs").glob("*.log"))
    stopped = json.loads(progress.read_text())
    assert not stopped["finished"] and stopped["step"] > 130, stopped
    assert stopped["lastCheckpointStep"] == stopped["step"], f"{stopped}\n{output}\n{tails}"

    resumed = subprocess.run(cli, capture_output=True, text=True, timeout=600)
    logs = {p.name: p.read_text() for p in (tmp_path / "logs").glob("*.log")}
    shown = "\n".join(f"--- {name}\n{text[-3000:]}" for name, text in sorted(logs.items()))
    assert resumed.returncode == 0, f"{resumed.stdout}\n{resumed.stderr}\n{shown}"
    # the group that starts first resumes from the emergency checkpoint; the other resumes
    # from it too, or, starting later, joins the first from its live state
    resumed_at = re.findall(r"resumed from the checkpoint of step (\d+)", "".join(logs.values()))
    assert resumed_at and set(resumed_at) == {str(stopped["step"])}, shown
    for name in ("worker-0.log", "worker-1.log"):
        joined = re.findall(r"joined from a live peer: copied .* of step (\d+)", logs[name])
        from_volume = "resumed from the checkpoint" in logs[name]
        assert from_volume or int(joined[-1]) > stopped["step"], shown
    final = json.loads(progress.read_text())
    assert final["finished"] and final["step"] == 600, final
