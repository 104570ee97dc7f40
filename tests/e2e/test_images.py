"""The Dockerfile's two images, built on a locally made Debian base and used as a user would.

No registry is reachable, so the engine is Debian's (started by ``testbed.docker``) and
the base comes from debootstrap. Cold, the trainer image (torch from PyPI, about 6 GB) takes a few
minutes to build; warm, the layer cache under ``${TORCHKUBE_CACHE}/docker`` makes it seconds.
Each build's time and size is printed; no record keeps them (docs/images.md).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from real_nodes_start import TRAINER_TAG, RealNodesStart, say_past_capture

from testbed.docker import (
    BuiltImage,
    Docker,
    DockerDaemon,
    build_image,
    ensure_base_image,
    run_container,
)
from testbed.errors import ClusterError

pytestmark = [pytest.mark.docker, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
OPERATOR_TAG = "torchkube/operator:test"
# Without torch, a regression that drags it (or CUDA) into the operator image is a GB, not MB.
OPERATOR_SIZE_BUDGET_BYTES = 400_000_000
# Two workers on CPU for four steps, checkpoints at steps 2 and 4: the operator's command line.
TRAIN_COMMAND = (
    "torchrun --standalone --nproc-per-node 2 -m torchkube.trainer"
    " --model=tiny --steps=4 --seqLen=32 --microBatchSize=2 --globalBatchSize=4 --warmupSteps=1"
    " --logIntervalSteps=1 --checkpoint-mode=sync --device=cpu"
    " --checkpoint-dir /checkpoints --checkpoint-interval-steps 2"
)


@pytest.fixture(scope="module")
def say(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Print past pytest's capture: a cold build runs for minutes and should show progress."""
    return say_past_capture(request, "testbed.docker")


@pytest.fixture(scope="module")
def docker(say: Callable[[str], None]) -> Iterator[Docker]:
    """The private Docker engine (reused if one already answers on its socket)."""
    daemon = DockerDaemon(report=say)
    try:
        client = daemon.start()
    except ClusterError as exc:
        pytest.fail(f"docker engine could not start -- {exc}", pytrace=False)
    yield client
    daemon.stop()


@pytest.fixture(scope="module")
def base_image(docker: Docker, say: Callable[[str], None]) -> str:
    """The locally made Debian base both targets build on (no base image can be pulled)."""
    try:
        return ensure_base_image(docker, report=say)
    except ClusterError as exc:
        pytest.fail(f"base image could not be built -- {exc}", pytrace=False)


def _build(
    docker: Docker, base: str, target: str, tag: str, say: Callable[[str], None]
) -> BuiltImage:
    say(f"building target {target} (cold: minutes; warm: seconds) ...")
    try:
        return build_image(
            docker, REPO, target, tag, {"PYTHON_BASE": base, "TRAINER_BASE": base}, report=say
        )
    except ClusterError as exc:
        pytest.fail(f"image could not be built -- {exc}", pytrace=False)


@pytest.fixture(scope="module")
def operator_image(docker: Docker, base_image: str, say: Callable[[str], None]) -> BuiltImage:
    """The operator target, built first: it is small and fails fast."""
    return _build(docker, base_image, "operator", OPERATOR_TAG, say)


@pytest.fixture(scope="module")
def trainer_image(
    docker: Docker,
    base_image: str,
    say: Callable[[str], None],
    real_nodes_start: RealNodesStart | None,
) -> BuiltImage:
    """The trainer target; torch comes from PyPI because the local base has none. When
    real-node tests run too, the background starter builds it for both (one build)."""
    if real_nodes_start is not None:
        built = real_nodes_start.wait_for("built")
        assert isinstance(built, BuiltImage)
        return built
    return _build(docker, base_image, "trainer", TRAINER_TAG, say)


def _output(proc: subprocess.CompletedProcess[str]) -> str:
    """A container's exit code and output, for assertion messages."""
    return f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"


def _uid(docker: Docker, image: BuiltImage) -> int:
    """The image's configured user, which must be numeric for Kubernetes' runAsNonRoot."""
    user = str(docker.image_config(image.tag).get("User") or "")
    uid = user.split(":")[0]
    assert uid.isdigit(), f"{image.tag}: USER {user!r} is not numeric"
    return int(uid)


def test_operator_image_runs_the_operator_command(docker: Docker, operator_image: BuiltImage):
    proc = run_container(docker, operator_image.tag, ["--help"])
    assert proc.returncode == 0, _output(proc)
    assert "Usage: torchkube operator" in proc.stdout, _output(proc)

    crd = run_container(docker, operator_image.tag, ["crd"], entrypoint="torchkube")
    assert crd.returncode == 0, _output(crd)
    assert "kind: CustomResourceDefinition" in crd.stdout, _output(crd)


def test_operator_image_has_no_torch(docker: Docker, operator_image: BuiltImage):
    no_torch = run_container(
        docker, operator_image.tag, ["-c", "import torch"], entrypoint="python"
    )
    assert no_torch.returncode != 0, "torch is installed in the operator image"
    assert "No module named 'torch'" in no_torch.stderr, _output(no_torch)

    # Every module the operator process loads imports without torch (and without numpy).
    code = "import torchkube.cli, torchkube.operator.main, torchkube.operator.handlers"
    imports = run_container(docker, operator_image.tag, ["-c", code], entrypoint="python")
    assert imports.returncode == 0, _output(imports)

    assert operator_image.size_bytes < OPERATOR_SIZE_BUDGET_BYTES, (
        f"operator image is {operator_image.size_bytes / 1e6:.0f} MB, over its "
        f"{OPERATOR_SIZE_BUDGET_BYTES / 1e6:.0f} MB budget"
    )


@pytest.mark.parametrize("image_name", ["operator_image", "trainer_image"])
def test_images_run_as_a_numeric_non_root_user(
    docker: Docker, image_name: str, request: pytest.FixtureRequest
):
    image: BuiltImage = request.getfixturevalue(image_name)
    assert _uid(docker, image) != 0
    proc = run_container(docker, image.tag, ["-u"], entrypoint="id")
    assert proc.returncode == 0, _output(proc)
    assert proc.stdout.strip() == str(_uid(docker, image))


def test_trainer_image_defaults_suit_torchrun(docker: Docker, trainer_image: BuiltImage):
    config = docker.image_config(trainer_image.tag)
    assert not config.get("Entrypoint"), "the operator sets the command; no entrypoint expected"
    assert config.get("Cmd") == ["torchrun", "--help"]
    env_list = config.get("Env")
    assert isinstance(env_list, list)
    env = dict(str(item).split("=", 1) for item in env_list)
    assert env.get("NCCL_DEBUG") == "WARN"
    assert env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING") == "1"
    assert env.get("PYTHONUNBUFFERED") == "1"
    assert config.get("WorkingDir") == "/workspace"

    default = run_container(docker, trainer_image.tag)  # the default command: torchrun --help
    assert default.returncode == 0, _output(default)
    assert "torchrun" in default.stdout, _output(default)


def test_trainer_image_trains_on_cpu_and_checkpoints(
    docker: Docker, trainer_image: BuiltImage, tmp_path: Path
):
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    uid = _uid(docker, trainer_image)
    # Like a volume with fsGroup in a pod: writable by the image's user, not by root alone.
    os.chown(checkpoints, uid, uid)
    proc = run_container(
        docker,
        trainer_image.tag,
        TRAIN_COMMAND.split(),
        volumes={checkpoints: "/checkpoints"},
        timeout=300,
    )
    assert proc.returncode == 0, _output(proc)
    final = checkpoints / "step-4"
    assert (final / "COMPLETE.json").is_file(), (
        f"no complete step-4 checkpoint; found {sorted(p.name for p in checkpoints.iterdir())}"
        f"\n{_output(proc)}"
    )
    json.loads((final / "COMPLETE.json").read_text())
    owners = {path.stat().st_uid for path in final.iterdir()}
    assert owners == {uid}, f"checkpoint files owned by {owners}, expected only uid {uid}"
