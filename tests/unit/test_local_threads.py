"""OpenMP threads per local worker process: the machine's cores shared out, never fewer than 1."""

import pytest

from torchkube.local.threads import threads_per_process


@pytest.mark.parametrize(
    ("cpus", "workers", "nproc", "threads"),
    [
        (2, 1, 1, 2),  # one worker on 2 cores: both cores, not 1
        (2, 2, 1, 1),
        (16, 2, 4, 2),
        (16, 3, 1, 5),  # rounded down: 3 × 5 = 15 ≤ 16 cores, no oversubscription
        (2, 4, 1, 1),  # more processes than cores: still one thread each
        (8, 1, "2", 4),  # torchrun's --nproc-per-node as the CLI passes it
        (8, 1, "auto", 1),  # one process per core (or per GPU): one thread each
    ],
)
def test_cores_are_shared_out(cpus: int, workers: int, nproc: int | str, threads: int) -> None:
    assert threads_per_process(cpus, workers, nproc) == threads


def test_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="workers"):
        threads_per_process(4, 0, 1)
