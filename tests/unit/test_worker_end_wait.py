"""How an agent's look at its workers waits (``torchrun.until_a_worker_ends``): woken by a
worker process's end, the whole interval when there is nothing to wait on — never a spin."""

import errno
import multiprocessing
import os
import subprocess
import time
from types import SimpleNamespace
from typing import Any

import pytest

from torchkube.elastic import torchrun

INTERVAL = 2.0


def _timed(pcontext: Any) -> float:
    began = time.monotonic()
    torchrun.until_a_worker_ends(pcontext, INTERVAL)
    return time.monotonic() - began


def _subprocess_context(*procs: subprocess.Popen[bytes]) -> SimpleNamespace:
    handlers = {rank: SimpleNamespace(proc=proc) for rank, proc in enumerate(procs)}
    return SimpleNamespace(subprocess_handlers=handlers, _running_local_ranks=set(handlers))


def _sleeper(seconds: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", str(seconds)])


def test_a_fresh_interpreters_end_wakes_the_look() -> None:
    ends, lasts = _sleeper(0.3), _sleeper(30)
    try:
        assert _timed(_subprocess_context(ends, lasts)) < INTERVAL / 2
    finally:
        lasts.kill()
        for proc in (ends, lasts):
            proc.wait()


def test_a_warm_workers_end_wakes_the_look() -> None:
    worker = multiprocessing.get_context("fork").Process(target=time.sleep, args=(0.3,))
    worker.start()
    try:
        processes = SimpleNamespace(sentinels={worker.sentinel: 0})
        assert _timed(SimpleNamespace(_pc=processes)) < INTERVAL / 2
    finally:
        worker.join()


@pytest.mark.parametrize(
    "pcontext",
    [
        None,
        SimpleNamespace(_pc=SimpleNamespace(sentinels={})),  # every warm worker ended
        SimpleNamespace(subprocess_handlers={0: None}, _running_local_ranks=set()),
    ],
    ids=["no workers", "no warm worker running", "no fresh interpreter running"],
)
def test_nothing_to_wait_on_sleeps_the_interval(pcontext: Any) -> None:
    """A round whose warm workers all ended without a result (``os._exit(0)``) stays
    HEALTHY in torch: a look that returned at once would spin at a core's full speed."""
    assert _timed(pcontext) >= INTERVAL * 0.9


def test_a_kernel_without_pidfds_is_looked_at_every_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    opened: list[int] = []
    real_open = os.pidfd_open

    def refused_second(pid: int, flags: int = 0) -> int:
        if opened:
            raise OSError(errno.ENOSYS, "pidfd_open not implemented")
        opened.append(real_open(pid, flags))
        return opened[-1]

    monkeypatch.setattr(os, "pidfd_open", refused_second)
    first, second = _sleeper(30), _sleeper(30)
    try:
        assert _timed(_subprocess_context(first, second)) >= INTERVAL * 0.9
        with pytest.raises(OSError):
            os.fstat(opened[0])  # the pidfd opened before the refusal was closed
    finally:
        for proc in (first, second):
            proc.kill()
            proc.wait()
