"""How the real-node testbed reads what hack/load-images.sh wrote on a node's containerd."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from testbed.containerd import IMAGE_ID_LABEL, names_tag

REPO = Path(__file__).resolve().parents[2]


def test_the_testbed_reads_the_label_the_script_writes():
    script = (REPO / "hack" / "load-images.sh").read_text()
    written = re.search(r"^readonly ID_LABEL=(\S+)$", script, re.MULTILINE)
    assert written is not None
    assert written.group(1) == IMAGE_ID_LABEL


@pytest.mark.parametrize(
    ("name", "tag", "same"),
    [
        ("docker.io/torchkube/trainer:test", "torchkube/trainer:test", True),
        ("docker.io/library/busybox:1", "busybox:1", True),
        ("docker.io/library/busybox:latest", "busybox", True),
        ("registry.example:5000/team/app:v2", "registry.example:5000/team/app:v2", True),
        ("docker.io/torchkube/trainer:dev", "torchkube/trainer:test", False),
        ("docker.io/other/trainer:test", "torchkube/trainer:test", False),
        ("sha256:0696b2ce44", "torchkube/trainer:test", False),
        ("docker.io/other/trainer:test", "trainer:test", False),
        ("localhost/app:1", "localhost/app:1", True),
    ],
)
def test_a_containerd_name_is_matched_to_its_docker_tag(name: str, tag: str, same: bool):
    assert names_tag(name, tag) is same
