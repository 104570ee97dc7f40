"""``torchkube run`` on the quick-start example: a chaos run ends exactly where a calm one does.

Both runs are real: two torchrun agents on loopback, the dedicated rendezvous store, the
trainer on CPU with deterministic kernels. In the chaos run a worker is SIGKILLed mid-way,
restarted like a replacement pod, and training resumes from the newest checkpoint.
"""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "quickstart.yaml"
pytestmark = pytest.mark.slow


def run(workdir: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchkube.cli",
            "run",
            str(EXAMPLE),
            "--fresh",
            "--workdir",
            str(workdir),
            *extra,
        ],
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
    calm, calm_final = run(tmp_path / "calm")
    chaos, chaos_final = run(tmp_path / "chaos", "--chaos-at-step", "70")
    print(calm.stdout[-800:], chaos.stdout[-1200:], sep="\n")
    assert calm_final["finished"] and chaos_final["finished"]
    assert chaos_final["step"] == calm_final["step"] == 200
    assert "chaos: SIGKILL worker" in chaos.stdout
    assert "restarts         1" in chaos.stdout
    assert chaos_final["loss"] == calm_final["loss"], "resumed training must be bitwise identical"


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
