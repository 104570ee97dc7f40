"""Step timing: the host clock on CPU, CUDA events on GPU (where the host only enqueues)."""

import time

import torch

from torchkube.trainer.timing import CudaStepTimer, StepTimer, step_timer


def test_the_device_chooses_the_clock() -> None:
    assert type(step_timer(torch.device("cpu"))) is StepTimer
    assert type(step_timer(torch.device("cuda", 0))) is CudaStepTimer  # no CUDA touched yet


def test_host_clock_times_each_step_at_once() -> None:
    timer = StepTimer()
    timer.start()
    time.sleep(0.02)
    timer.stop()
    [seconds] = timer.finished()
    assert 0.02 <= seconds < 1.0 and timer.finished() == []


class FakeEvent:
    """A CUDA event on a stream the test drives: recorded where the host has enqueued up to,
    done once the GPU got there."""

    enqueued = 0.0  # stream time the host has enqueued work up to
    executed = 0.0  # stream time the GPU has run up to

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.at = 0.0

    def record(self) -> None:
        self.at = FakeEvent.enqueued

    def query(self) -> bool:
        return self.at <= FakeEvent.executed

    def synchronize(self) -> None:
        FakeEvent.executed = max(FakeEvent.executed, self.at)

    def elapsed_time(self, end: "FakeEvent") -> float:
        return (end.at - self.at) * 1000  # milliseconds, as CUDA reports


def test_cuda_events_report_a_step_once_the_gpu_ran_it() -> None:
    """The host returns from a step once it has enqueued it; the events say how long the GPU
    took, once it did (or at once when asked to wait: at a log step, which syncs anyway)."""
    timer = CudaStepTimer(event=FakeEvent)
    FakeEvent.enqueued = FakeEvent.executed = 10.0
    timer.start()
    FakeEvent.enqueued = 10.5  # the step's kernels, queued
    timer.stop()
    assert timer.finished() == []
    FakeEvent.executed = 10.5
    assert timer.finished() == [0.5] and timer.finished() == []
    timer.start()
    FakeEvent.enqueued = 10.75
    timer.stop()
    assert timer.finished(wait=True) == [0.25]
