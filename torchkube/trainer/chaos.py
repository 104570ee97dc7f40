"""``torchkube run --chaos-at-step N``: the worker it is going to kill holds still at step N.

The runner sees training's progress only when it polls, and on a busy machine training
would pass several steps between the one asked for and the kill. So the runner names the
step to the worker it will kill (:attr:`Env.CHAOS_HOLD_AT_STEPS`); each of that worker's
training processes stops itself once the step is done, the other workers wait for it in their
next collective, and the runner's SIGKILL of the worker's whole tree (its pod) lands at that
step whatever the load. The runner, not the worker, kills: it alone knows the moment of the
loss it accounts for. The operator never sets the variable: nothing here acts in a cluster.
"""

import logging
import os
import signal

from torchkube.api.contract import Env, chaos_hold_steps

log = logging.getLogger("torchkube.trainer")


class ChaosHold:
    """Stops this process after each step the runner will kill its worker at."""

    def __init__(self, steps: frozenset[int]) -> None:
        self.steps = steps

    @classmethod
    def from_env(cls) -> "ChaosHold":
        return cls(chaos_hold_steps(os.environ.get(Env.CHAOS_HOLD_AT_STEPS, "")))

    def after(self, step: int) -> None:
        """Called once ``step`` is done (and reported): stop here if the kill is due at it."""
        if step in self.steps:
            log.warning("chaos: holding at step %d until torchkube run kills this worker", step)
            os.kill(os.getpid(), signal.SIGSTOP)
