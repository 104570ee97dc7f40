"""``torchkube run``'s pure parts: the threads each training process gets."""

from torchkube.local.runner import threads_per_process


def test_one_worker_gets_every_core() -> None:
    assert threads_per_process(cpus=2, processes=1) == 2


def test_cores_are_shared_out_and_never_below_one() -> None:
    assert threads_per_process(cpus=16, processes=4) == 4
    assert threads_per_process(cpus=2, processes=4) == 1
