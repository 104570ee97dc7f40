"""``torchkube run`` with ``failurePolicy.recovery: live`` and a replica group that crashes at
every start (its worker's data is bad) while the other trains: the crash loop spends
``maxRestarts`` and the run ends Failed naming the group, instead of replacing it for ever.

Real processes: the launchers, torchrun's in-place restarts of worker 1's group, the records
its launcher posts to the store, the termination messages, and worker 0 training the built-in
trainer through torchft's Lighthouse. Each start of worker 1 fails before committing a step,
so its launcher's records and its exit say none was committed; the first loss is free, the
second is one more than ``maxRestarts: 0``.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "live-recovery.yaml"
pytestmark = pytest.mark.slow

CRASHING = """
import os, sys, time

if os.environ.get("TORCHKUBE_REPLICA_INDEX") == "1":
    time.sleep(0.2)
    sys.exit("ValueError: the shard this group reads is corrupt")
from torchkube.trainer.entrypoint import exit_with, main

exit_with(main())
"""


TIMEOUT_SECONDS = 240
"""Well past the end this run should have (80-120 s on a busy 2-core machine)."""


def run_for(cli: list[str], seconds: float) -> subprocess.CompletedProcess[str]:
    """``cli`` to its end; past ``seconds`` it is stopped with SIGTERM, which ``torchkube
    run`` passes to every worker (a timeout's SIGKILL would leave them running), and the test
    fails with what it printed."""
    proc = subprocess.Popen(cli, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.terminate()
        stdout, stderr = proc.communicate(timeout=120)
        raise AssertionError(
            f"still running after {seconds} s: the crash loop was never counted\n"
            f"{stdout[-4000:]}\n{stderr[-2000:]}"
        ) from None
    return subprocess.CompletedProcess(cli, proc.returncode, stdout, stderr)


def test_a_live_group_that_crashes_at_every_start_ends_the_run_naming_it(tmp_path: Path) -> None:
    script = tmp_path / "crash_one_group.py"
    script.write_text(CRASHING)
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["spec"]["command"] = [str(script)]
    manifest["spec"]["failurePolicy"]["maxRestarts"] = 0
    manifest["spec"]["trainer"]["steps"] = 100_000  # worker 0 trains on until the run ends
    job = tmp_path / "live-crash-loop.yaml"
    job.write_text(yaml.safe_dump(manifest))
    cli = [sys.executable, "-m", "torchkube.cli", "run", str(job), "--workdir", str(tmp_path)]
    result = run_for(cli, TIMEOUT_SECONDS)
    logs = {p.name: p.read_text() for p in (tmp_path / "logs").glob("*.log")}
    shown = "\n".join(f"--- {name}\n{text[-2000:]}" for name, text in sorted(logs.items()))
    output = f"{result.stdout[-4000:]}\n{result.stderr[-2000:]}\n{shown}"
    assert result.returncode == 1, output
    assert "FAILED — replica group of slot 1 crash-loops" in result.stdout, output
    assert "exceed failurePolicy.maxRestarts (0)" in result.stdout, output
    assert "pod worker-1 on node" in result.stdout and "exited with code 1" in result.stdout
    assert "lost again without committing a step since its last failure" in result.stdout
    assert "restarts         0\n" in result.stdout, "no restart of the job: worker 0 trained on"
    progress = json.loads((tmp_path / "checkpoints" / "progress.json").read_text())
    assert progress["step"] > 0, progress
