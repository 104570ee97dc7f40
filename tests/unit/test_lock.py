"""Installs that reproduce: the lock files under requirements/ pin, with hashes, a version of
every requirement pyproject.toml lists for them (hack/lock_inputs.py says which), and the
installers use them: hack/bootstrap.sh the dev lock, the Dockerfile the image locks."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "hack"))
from lock_inputs import inputs, name  # noqa: E402

LOCKS = ROOT / "requirements"


def pins(lock: str) -> dict[str, tuple[str, int]]:
    """Package -> (pinned version, number of hashes) in requirements/<lock>.txt."""
    text = (LOCKS / f"{lock}.txt").read_text()
    found: dict[str, tuple[str, int]] = {}
    for block in re.split(r"\n(?=\S)", text):
        match = re.match(r"([A-Za-z0-9_.\-\[\],]+)==(\S+)", block)
        if match:
            found[name(match.group(1))] = (match.group(2), block.count("--hash=sha256:"))
    return found


@pytest.mark.parametrize("lock", sorted(inputs()))
def test_every_requirement_is_pinned_with_hashes_within_its_range(lock: str) -> None:
    pinned = pins(lock)
    assert pinned, f"requirements/{lock}.txt pins nothing"
    unhashed = sorted(package for package, (_, hashes) in pinned.items() if not hashes)
    assert not unhashed, f"requirements/{lock}.txt: no hashes for {unhashed}"
    for line in inputs()[lock]:
        requirement = Requirement(line)
        package = name(requirement.name)
        assert package in pinned, f"{line} is not locked in requirements/{lock}.txt: hack/lock.sh"
        version = pinned[package][0]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"requirements/{lock}.txt pins {package}=={version}, outside {line}: hack/lock.sh"
        )


def test_the_image_locks_agree_and_the_operators_has_no_torch() -> None:
    trainer, torch, operator = pins("trainer"), pins("torch"), pins("operator")
    assert "torch" in torch and set(torch) <= set(trainer)
    assert {p: v for p, (v, _) in torch.items()} == {p: trainer[p][0] for p in torch}
    assert not {"torch", "numpy", "triton"} & set(operator)
    shared = set(operator) & set(trainer)
    assert {p: operator[p][0] for p in shared} == {p: trainer[p][0] for p in shared}


def test_the_installers_install_the_locks_with_their_hashes() -> None:
    bootstrap = (ROOT / "hack" / "bootstrap.sh").read_text()
    assert "LOCK=requirements/dev.txt" in bootstrap
    assert 'install -q --require-hashes -r "$LOCK"' in bootstrap
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "COPY requirements/ /reqs/" in dockerfile
    assert dockerfile.count("--require-hashes -r /tmp/reqs/") == 3  # torch, the rest, operator
    assert "!requirements/" in (ROOT / ".dockerignore").read_text()
