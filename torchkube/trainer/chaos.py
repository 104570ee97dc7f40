"""``torchkube run --chaos-at-step N``: the worker it is going to kill holds still at step N.

The runner sees training's progress only when it polls, and on a busy machine training
would pass several steps between the one asked for and the kill. So the runner names the
step to the worker it will kill (:attr:`Env.CHAOS_HOLD_AT_STEPS`); each of that worker's
training processes stops itself once the step is done, the other workers wait for it in their
next collective, and the runner's SIGKILL of the worker's whole tree (its pod) lands at that
step whatever the load. The runner, not the worker, kills: it alone knows the moment of the
loss it accounts for.

A kill can also be aimed inside a phase (:class:`ChaosPhase`: serving or receiving a live
state copy, committing a checkpoint): the runner arms the phase with a file in
:attr:`Env.CHAOS_ARM_DIR`, and the first process to reach it claims the arming (renames the
file to ``held-<phase>``: one process holds per arming), writes its pid into it and stops
itself there (:func:`hold_if_armed`) until the runner kills its worker.

A benchmark of sustained failures also stretches every full micro-batch to
:attr:`Env.CHAOS_COMPUTE_SECONDS` (:meth:`ChaosHold.computing`): a CPU step standing for an
accelerator's, as long against the failure detection as a GPU job's step, so that a loss lands
mid-step as often as it would there, and longer where fewer replica groups share the batch —
in proportion to the sequences each computes, as an accelerator's compute-bound step is, not
to its count of micro-batches (14 sequences in four micro-batches of 3 or 4 last 14/12 of 12
sequences in three of 4, not 4/3).
The operator never sets either variable: nothing here acts in a cluster.
"""

import contextlib
import logging
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

from torchkube.api.contract import ChaosPhase, Env, chaos_hold_steps

log = logging.getLogger("torchkube.trainer")


class ChaosHold:
    """Stops this process after each step the runner will kill its worker at."""

    def __init__(self, steps: frozenset[int], compute_seconds: float = 0.0) -> None:
        self.steps = steps
        self.compute_seconds = compute_seconds

    @classmethod
    def from_env(cls) -> "ChaosHold":
        steps = chaos_hold_steps(os.environ.get(Env.CHAOS_HOLD_AT_STEPS, ""))
        return cls(steps, float(os.environ.get(Env.CHAOS_COMPUTE_SECONDS) or 0.0))

    @contextlib.contextmanager
    def computing(self, sequences: int, micro_batch_size: int) -> Iterator[None]:
        """A step's ``sequences``, lasting at least ``compute_seconds`` per full micro-batch
        of ``micro_batch_size`` (0: as long as they take)."""
        began = time.monotonic()
        yield
        rest = began + self.compute_seconds * sequences / micro_batch_size - time.monotonic()
        if rest > 0:
            time.sleep(rest)

    def after(self, step: int) -> None:
        """Called once ``step`` is done (and reported): stop here if the kill is due at it."""
        if step in self.steps:
            log.warning("chaos: holding at step %d until torchkube run kills this worker", step)
            os.kill(os.getpid(), signal.SIGSTOP)


def hold_if_armed(phase: ChaosPhase) -> None:
    """Stop this process here if ``torchkube run`` armed ``phase`` and no other process has
    claimed it yet (see the module docstring); without the runner's folder, nothing."""
    folder = os.environ.get(Env.CHAOS_ARM_DIR)
    if not folder:
        return
    held = Path(folder) / f"held-{phase}"
    try:  # one step from armed to held: the runner never sees the folder empty between
        os.rename(Path(folder) / f"arm-{phase}", held)
    except FileNotFoundError:
        return
    held.write_text(f"{os.getpid()}\n")
    log.warning("chaos: holding while %s until torchkube run kills this worker", phase)
    os.kill(os.getpid(), signal.SIGSTOP)
