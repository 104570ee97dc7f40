"""``torchkube run`` on the quick-start example: a chaos run ends exactly where a calm one does.

Both runs are real: two torchrun agents on loopback, the dedicated rendezvous store, the
trainer on CPU with deterministic kernels. In the chaos run a worker is SIGKILLed mid-way,
restarted like a replacement pod, and training resumes from the newest checkpoint.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from torchkube.api.contract import HANG_REPORT
from torchkube.local.processes import children_of

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "quickstart.yaml"
pytestmark = pytest.mark.slow


def command(workdir: Path, *extra: str) -> list[str]:
    """``torchkube run`` of the quick start from scratch in ``workdir``."""
    cli = [sys.executable, "-m", "torchkube.cli", "run", str(EXAMPLE), "--fresh"]
    return [*cli, "--workdir", str(workdir), *extra]


def run(workdir: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    result = subprocess.run(
        command(workdir, *extra),
        capture_output=True,
        text=True,
        timeout=600,
    )
    logs = "\n".join(
        f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted((workdir / "logs").glob("*.log"))
    )
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{logs}"
    return result, json.loads((workdir / "checkpoints" / "progress.json").read_text())


def test_chaos_run_finishes_with_the_same_loss(tmp_path: Path) -> None:
    """A worker SIGKILLed at step 70, a training process alone at step 100 (a crash), the
    rendezvous store at step 140: the worker and the store are restarted as their pods would
    be, the crashed process by its launcher, and the run ends exactly where a calm one does.
    (Before the store was restarted, its loss failed every worker again and again until
    maxRestarts ran out.)"""
    calm, calm_final = run(tmp_path / "calm")
    chaos, chaos_final = run(
        tmp_path / "chaos",
        *("--chaos-at-step", "70", "--chaos-crash-at-step", "100"),
        *("--chaos-store-at-step", "140"),
    )
    print(calm.stdout[-800:], chaos.stdout[-1200:], sep="\n")
    assert calm_final["finished"] and chaos_final["finished"]
    assert chaos_final["step"] == calm_final["step"] == 200
    assert "chaos: SIGKILL worker" in chaos.stdout
    assert "chaos: SIGKILL the rendezvous store" in chaos.stdout
    # The worker to be killed holds still at step 70, so the kill lands there whatever the
    # load; the crash and the store's kill land on the first step the runner sees at or past
    # the one asked for (100 → 100..109 on a quiet machine, later if busy).
    worker_kill = re.search(r"worker 0 killed \(chaos\) at step (\d+)", chaos.stdout)
    store_kill = re.search(r"rendezvous store killed \(chaos\) at step (\d+)", chaos.stdout)
    crash = re.search(r"worker (\d) crashed \(chaos\) at step (\d+)", chaos.stdout)
    assert worker_kill and int(worker_kill[1]) == 70, chaos.stdout
    assert crash and 100 <= int(crash[2]) < 140, chaos.stdout
    assert "chaos: SIGKILL a training process of worker" in chaos.stdout
    assert store_kill and 140 <= int(store_kill[1]) < 200, chaos.stdout
    logs = "".join(p.read_text() for p in (tmp_path / "chaos" / "logs").glob("worker-*.log"))
    assert "re-joining through a new connection to the store" in logs
    # the crash: its launcher's log has the failure with its traceback, and a new round
    assert "terminated with signal SIGKILL" in logs and "Traceback" in logs
    assert chaos_final["loss"] == calm_final["loss"], "resumed training must be bitwise identical"


def _processes_using(workdir: Path) -> list[int]:
    """Processes whose command line or environment names the work dir: what the run started."""
    found = []
    marker = str(workdir).encode()
    for pid in {p for children in children_of().values() for p in children}:
        try:
            blob = Path(f"/proc/{pid}/cmdline").read_bytes()
            blob += Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if marker in blob and pid != os.getpid():
            found.append(pid)
    return found


def test_sigterm_stops_the_whole_tree_after_an_emergency_checkpoint(tmp_path: Path) -> None:
    """As a CI timeout or a supervisor stops it: no store, agent or trainer is left running
    or writing into the work dir, and training stopped on a checkpoint of its last step."""
    workdir = tmp_path / "stopped"
    proc = subprocess.Popen(
        command(workdir),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    progress = workdir / "checkpoints" / "progress.json"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if progress.exists() and json.loads(progress.read_text() or "{}").get("step", 0) >= 30:
            break
        time.sleep(0.5)
    else:
        proc.kill()
        raise AssertionError("training never reached step 30")
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=180)
    assert proc.returncode == 1, output
    assert "stopped by SIGTERM" in output
    time.sleep(1)
    assert _processes_using(workdir) == [], "processes left behind"
    final = json.loads(progress.read_text())
    assert not final["finished"]
    if final["lastCheckpointStep"] != final["step"]:
        # SIGTERM fell while an async save was being written: that save is finished instead of
        # a second one (one write fits the grace), and the trainer says what will be redone.
        logs = "".join(p.read_text() for p in (workdir / "logs").glob("worker-*.log"))
        said = f"stopping at step {final['step']} with the checkpoint of step "
        assert f"{said}{final['lastCheckpointStep']}, which was being written" in logs, final


def test_invalid_job_is_refused_with_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        EXAMPLE.read_text().replace("replicas: {min: 2, max: 2}", "replicas: {min: 3, max: 2}")
    )
    result = subprocess.run(
        [sys.executable, "-m", "torchkube.cli", "run", str(bad), "--workdir", str(tmp_path / "w")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "spec.replicas" in result.stderr and "less than or equal" in result.stderr


def test_a_hung_worker_is_stopped_and_a_spare_takes_its_place(tmp_path: Path) -> None:
    """A training worker's trainer SIGSTOPped at step 60 (a wedged GPU, a dead mount): its launcher
    finds it after hangTimeoutSeconds, dumps its stacks and ends it with exit code 124, the
    operator's policy records a Hang; the spare standing by takes its place at once and the
    run ends with every step."""
    job = tmp_path / "spare.yaml"
    job.write_text(
        EXAMPLE.read_text()
        .replace("replicas: {min: 2, max: 2}", "replicas: {min: 2, max: 2, spares: 1}")
        .replace("maxRestarts: 5", "maxRestarts: 5\n    hangTimeoutSeconds: 10")
    )
    workdir = tmp_path / "run"
    cli = [sys.executable, "-m", "torchkube.cli", "run", str(job), "--workdir", str(workdir)]
    result = subprocess.run(
        [*cli, "--chaos-stop-at-step", "60"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    logs = {p.name: p.read_text() for p in (workdir / "logs").glob("worker-*")}
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{logs}"
    print(result.stdout[-800:])
    final = json.loads((workdir / "checkpoints" / "progress.json").read_text())
    assert final["finished"] and final["step"] == 200 and final["worldSize"] == 2
    stopped = re.search(r"chaos: SIGSTOP a training process of worker (\d)", result.stdout)
    assert stopped, result.stdout
    victim = stopped.group(1)
    assert f"worker {victim} stopped (chaos: hung) at step" in result.stdout
    assert "exited with 124" not in result.stdout, "one hang, one failure"
    log = logs[f"worker-{victim}.log"]
    hung = next(line for line in log.splitlines() if line.startswith(HANG_REPORT))
    assert "stopped by a signal" in hung and "Python stacks of every thread" in hung
    # The hung one's place went to an agent standing by (the spare, or the hung worker's
    # replacement when it was up first: who joins is a race), and the round formed once —
    # not a round restarting for an agent that cannot get in (it once did, for good).
    resumes = {name: text.count("resumed from") for name, text in logs.items()}
    assert max(resumes.values()) <= 3, resumes
