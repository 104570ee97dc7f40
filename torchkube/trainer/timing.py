"""How long an optimizer step takes: the host clock on CPU, CUDA events on GPU.

On a GPU the host only enqueues kernels and returns long before they ran, so its clock would
time the enqueueing (until the next sync). CUDA events recorded on the stream before and after
the step time the GPU's work instead; they are read once the GPU got past them, so timing adds
no sync to the step.
"""

import time
from collections import deque
from typing import Any

import torch


class StepTimer:
    """Wall time of each step on the host clock: right when the work is done on return."""

    def __init__(self) -> None:
        self._started = 0.0
        self._done: list[float] = []

    def start(self) -> None:
        self._started = time.monotonic()

    def stop(self) -> None:
        self._done.append(time.monotonic() - self._started)

    def finished(self, wait: bool = False) -> list[float]:
        """Seconds of the steps timed since the last call, in order (``wait``: all of them)."""
        done, self._done = self._done, []
        return done


class CudaStepTimer(StepTimer):
    """GPU time of each step from a pair of CUDA events on the current stream."""

    def __init__(self, event: Any = None) -> None:
        super().__init__()
        self._event = event or torch.cuda.Event
        self._begin: Any = None
        self._pending: deque[tuple[Any, Any]] = deque()

    def start(self) -> None:
        self._begin = self._event(enable_timing=True)
        self._begin.record()

    def stop(self) -> None:
        end = self._event(enable_timing=True)
        end.record()
        self._pending.append((self._begin, end))

    def finished(self, wait: bool = False) -> list[float]:
        """Seconds of the steps the GPU has finished; with ``wait``, of all, waiting for them."""
        done = []
        while self._pending and (wait or self._pending[0][1].query()):
            begin, end = self._pending.popleft()
            end.synchronize()
            done.append(begin.elapsed_time(end) / 1000)
        return done


def step_timer(device: torch.device) -> StepTimer:
    """CUDA events on a GPU, the host clock elsewhere."""
    return CudaStepTimer() if device.type == "cuda" else StepTimer()
