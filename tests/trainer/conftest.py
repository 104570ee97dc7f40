"""Fixtures for the trainer tests (helpers live in trainer_harness.py)."""

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from trainer_harness import Torchrun

from torchkube.trainer.prepare import prepare_sample

if TYPE_CHECKING:
    from torchkube.trainer.distributed import DistInfo


@pytest.fixture(scope="session")
def token_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``train.bin`` / ``val.bin`` of a small sample corpus (≈ 90k tokens)."""
    folder = tmp_path_factory.mktemp("data")
    prepare_sample(folder, num_docs=400)
    return folder


@pytest.fixture
def torchrun(tmp_path: Path) -> Iterator[Torchrun]:
    runner = Torchrun(tmp_path)
    try:
        yield runner
    finally:
        runner.close()


@pytest.fixture
def trainer_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """caplog for the trainer's logger, which does not propagate to the root logger."""
    logger = logging.getLogger("torchkube.trainer")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="torchkube.trainer")
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)


@pytest.fixture(scope="module")
def info() -> Iterator["DistInfo"]:
    """A world of one process (gloo), shared by the in-process tests of one module."""
    from torchkube.api.trainer import TrainerSpec
    from torchkube.trainer import distributed

    dist_info = distributed.setup(TrainerSpec(device="cpu"))
    try:
        yield dist_info
    finally:
        distributed.teardown()
