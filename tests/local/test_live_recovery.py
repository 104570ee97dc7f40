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
import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "live-recovery.yaml"
KILL_AT = 60
CRASH_AT = 450
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_lost_worker_costs_the_other_one_step_and_rejoins_from_it(
    tmp_path: Path, strategy: str
) -> None:
    """Two processes per pod, DDP or FSDP inside each group: worker 1 killed whole at step
    60, then one of its training processes at step 450 (its launcher restarts the pod's
    workers in place): two replica groups lost, neither a restart; the replacement copies
    the survivor's state (each process its shards, under FSDP)."""
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["spec"]["nprocPerNode"] = 2
    manifest["spec"]["trainer"]["strategy"] = strategy
    job = tmp_path / "live-recovery.yaml"
    job.write_text(yaml.safe_dump(manifest))
    cli = [sys.executable, "-m", "torchkube.cli", "run", str(job), "--nproc", "2"]
    chaos = ["--chaos-at-step", str(KILL_AT), "--chaos-worker", "1"]
    chaos += ["--chaos-crash-at-step", str(CRASH_AT)]
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

    # the operator's accounting: two replica groups lost (the in-place restart reported
    # through the job's restart board like a pod's), no restart of the job
    assert re.search(r"restarts +0\n", result.stdout), result.stdout[-3000:]
    assert re.search(r"groups lost +2 ", result.stdout), result.stdout[-3000:]
    # worker 1 committed steps between its two losses (its launcher's record of the crash says
    # from which): no crash loop, nothing spent of maxRestarts
    assert "counted towards maxRestarts" not in result.stdout, result.stdout[-3000:]
    assert "restarted its workers in place" in result.stdout, result.stdout[-3000:]

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

    # the replacement copied the live state at a step after the kill, then trained to the end;
    # restarted in place after its crash, it copied it again (each start of worker 1 that found
    # worker 0 training joined from it)
    pattern = r"joined from a live peer: copied .* of step (\d+)"
    joined = [int(step) for step in re.findall(pattern, replacement)]
    after_kill = [step for step in joined if step > int(shrank[1])]
    assert after_kill and after_kill[-1] >= CRASH_AT, shown
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


def _at(line: str) -> float:
    """The time of a trainer log line (``2026-11-26 11:38:27,335 …``), in seconds."""
    clock = line.split()[1]
    hours, minutes, seconds = clock.replace(",", ".").split(":")
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds)


def test_a_hot_spare_stands_by_and_takes_a_lost_groups_place_at_next_quorum(
    tmp_path: Path,
) -> None:
    """replicas.spares 1: the third worker stands by (started, model built) instead of
    training as one more group; worker 1 killed, it joins from the survivor at once, and the
    lost slot's replacement stands by in its turn."""
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["spec"]["replicas"]["spares"] = 1
    job = tmp_path / "live-spare.yaml"
    job.write_text(yaml.safe_dump(manifest))
    cli = [sys.executable, "-m", "torchkube.cli", "run", str(job), "--workdir", str(tmp_path)]
    chaos = ["--chaos-at-step", str(KILL_AT), "--chaos-worker", "1"]
    result = subprocess.run([*cli, *chaos], capture_output=True, text=True, timeout=600)
    logs = {p.name: p.read_text() for p in (tmp_path / "logs").glob("*.log")}
    shown = "\n".join(f"--- {name}\n{text[-3000:]}" for name, text in sorted(logs.items()))
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{shown}"
    final = json.loads((tmp_path / "checkpoints" / "progress.json").read_text())
    assert final["finished"] and final["step"] == 600, final
    survivor, spare = logs["worker-0.log"], logs["worker-2.log"]

    # never more groups than the target: the spare did not train beside the two
    assert "3 replica groups" not in survivor, shown
    assert "live: standing by" in spare, shown
    joined = re.search(r".*joined from a live peer: copied .* of step (\d+).*", spare)
    assert joined and int(joined[1]) >= KILL_AT, shown

    # the spare was back in the quorum within seconds of the loss, not a restart's start-up
    lost = re.search(r".*quorum changed from 2 to 1 replica groups.*", survivor)
    whole = re.search(r".*quorum changed from 1 to 2 replica groups.*", survivor)
    assert lost and whole, shown
    assert _at(whole[0]) - _at(lost[0]) < 10, (lost[0], whole[0])

    # the lost slot's replacement found the job whole and stood by in its turn to the end
    # (released, or stopped with the run just before it read that training ended)
    stood_by = logs["worker-1.log"].split("live: standing by")
    assert len(stood_by) == 2, shown
    assert "joined from a live peer" not in stood_by[1], shown
    assert "live: replica group" not in stood_by[1] and "quorum changed" not in stood_by[1], shown


def test_a_live_job_trains_on_through_the_loss_of_its_rendezvous_store(tmp_path: Path) -> None:
    """The rendezvous store SIGKILLed at step 100 and started again at once on its port, as
    the kubelet restarts its pod's container (or as a new pod answers under its name): each
    pod is a torchrun world of its own, which needs the store only to start its workers, so
    both replica groups train on through it — no worker stopped, none resumed from a
    checkpoint, no restart counted. (Before, every launcher stopped its workers at the loss
    and every group restarted from the newest checkpoint.)"""
    cli = [sys.executable, "-m", "torchkube.cli", "run", str(EXAMPLE), "--workdir", str(tmp_path)]
    result = subprocess.run(
        [*cli, "--chaos-store-at-step", "100"], capture_output=True, text=True, timeout=600
    )
    logs = {p.name: p.read_text() for p in (tmp_path / "logs").glob("*.log")}
    shown = "\n".join(f"--- {name}\n{text[-3000:]}" for name, text in sorted(logs.items()))
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{shown}"
    final = json.loads((tmp_path / "checkpoints" / "progress.json").read_text())
    assert final["finished"] and final["step"] == 600, final
    killed = re.search(r"rendezvous store killed \(chaos\) at step (\d+)", result.stdout)
    assert killed and 100 <= int(killed[1]) < 600, result.stdout[-3000:]
    assert re.search(r"restarts +0\n", result.stdout), result.stdout[-3000:]
    assert "the replica groups train on without it" in result.stdout, result.stdout[-3000:]
    for name in ("worker-0.log", "worker-1.log"):
        log = logs[name]
        assert "resumed from" not in log, shown
        assert "re-joining through a new connection to the store" not in log, shown
        assert "restarting the workers in place" not in log, shown
    steps = [int(s) for s in re.findall(r"step (\d+)/600 \|", logs["worker-0.log"])]
    assert steps == sorted(set(steps)) and steps[-1] == 600, steps


def test_a_live_job_waits_for_its_lost_lighthouse_and_restarts_nothing(tmp_path: Path) -> None:
    """The Lighthouse SIGKILLed at step 100 and started again 8 s later, as the operator
    replaces its pod: it holds no training state, so every replica group waits at its next
    quorum until the new one answers and goes on at the same step — no worker stopped, none
    resumed from a checkpoint, no restart counted. (Before, the quorum failed: each group's
    torchft Manager waited out its whole quorum timeout, raised, and both groups restarted from
    the newest checkpoint.)"""
    cli = [sys.executable, "-m", "torchkube.cli", "run", str(EXAMPLE), "--workdir", str(tmp_path)]
    away = ["--chaos-lighthouse-at-step", "100", "--chaos-replace-after", "8"]
    result = subprocess.run([*cli, *away], capture_output=True, text=True, timeout=600)
    logs = {p.name: p.read_text() for p in (tmp_path / "logs").glob("*.log")}
    shown = "\n".join(f"--- {name}\n{text[-3000:]}" for name, text in sorted(logs.items()))
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{shown}"
    final = json.loads((tmp_path / "checkpoints" / "progress.json").read_text())
    assert final["finished"] and final["step"] == 600, final
    killed = re.search(r"torchft lighthouse killed \(chaos\) at step (\d+)", result.stdout)
    assert killed and 100 <= int(killed[1]) < 600, result.stdout[-3000:]
    assert re.search(r"restarts +0\n", result.stdout), result.stdout[-3000:]
    for name in ("worker-0.log", "worker-1.log"):
        log = logs[name]
        assert "resumed from" not in log, shown
        assert "restarting the workers in place" not in log, shown
    steps = [int(s) for s in re.findall(r"step (\d+)/600 \|", logs["worker-0.log"])]
    assert steps == sorted(set(steps)) and steps[-1] == 600, steps
