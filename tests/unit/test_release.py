"""Images a user can pull: the release workflow passes actionlint, and every default that names
an image (the chart's operator, the API's trainer) points at what that workflow publishes for
this version, so ``helm install`` with the defaults never pulls a name nobody publishes."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from torchkube.api.spec import DEFAULT_IMAGE

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
CHART = ROOT / "charts" / "torchkube"
REGISTRY = "ghcr.io/torchkube"


@pytest.fixture(scope="module")
def actionlint() -> Path:
    """actionlint built from its pinned module by hack/build-tools.sh (cached: well under 1 s)."""
    result = subprocess.run(
        ["bash", str(ROOT / "hack" / "build-tools.sh")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, f"hack/build-tools.sh failed:\n{result.stderr}"
    return Path(result.stdout.strip().splitlines()[-1]) / "actionlint"


def lint(actionlint: Path, workflow: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(actionlint), "-no-color", str(workflow)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def project_version() -> str:
    version: str = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    return version


def test_release_workflow_passes_actionlint(actionlint: Path, tmp_path: Path) -> None:
    result = lint(actionlint, WORKFLOW)
    assert result.returncode == 0, result.stdout + result.stderr
    # The check can fail: a misspelt context in a copy of the workflow is reported.
    broken = tmp_path / "release.yml"
    broken.write_text(
        WORKFLOW.read_text().replace("github.repository_owner", "github.repository_ownr")
    )
    refused = lint(actionlint, broken)
    assert refused.returncode != 0 and "repository_ownr" in refused.stdout


def test_release_workflow_pushes_both_targets_to_the_owners_ghcr_on_a_version_tag() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    assert workflow[True]["push"]["tags"] == ["v*"]  # YAML 1.1 reads the key `on` as True
    assert workflow["permissions"]["packages"] == "write"
    job = workflow["jobs"]["images"]
    assert job["strategy"]["matrix"]["target"] == ["operator", "trainer"]
    steps = {step.get("uses", step.get("name")): step for step in job["steps"]}
    build = steps["docker/build-push-action@v6"]["with"]
    assert build["platforms"] == "linux/amd64" and build["push"] is True
    assert build["target"] == "${{ matrix.target }}"
    meta = steps["Version and image name"]
    assert meta["env"]["OWNER"] == "${{ github.repository_owner }}"
    assert 'image="ghcr.io/${OWNER,,}/torchkube-${TARGET}"' in meta["run"]


def test_defaults_point_at_the_published_images_of_this_version() -> None:
    version = project_version()
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert chart["appVersion"] == version
    assert values["image"]["repository"] == f"{REGISTRY}/torchkube-operator"
    assert values["image"]["tag"] == ""  # the appVersion, i.e. this release
    assert f"{REGISTRY}/torchkube-trainer:{version}" == DEFAULT_IMAGE
    example = yaml.safe_load((ROOT / "examples" / "trainingjob.yaml").read_text())
    assert example["spec"]["image"] == DEFAULT_IMAGE
