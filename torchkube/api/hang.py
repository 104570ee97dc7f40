"""When a worker counts as hung: one rule for the launcher's watchdog and the operator's goodput.

A worker hangs when it finishes no training step for ``failurePolicy.hangTimeoutSeconds``.
Unset, the timeout follows the job's own pace — ten times the median step time, and never
less than a minute, so a slow first step, an evaluation or a synchronous checkpoint between
two steps is not mistaken for a hang. It stays below the trainer's collective timeout: a
collective that gives up first would end the round without the stacks that say where it was
stuck (the watchdog's job). The operator charges the same time to goodput's ``stall``
(torchkube/operator/goodput.py), so no torch here.
"""

HANG_MIN_SECONDS = 60.0
HANG_STEPS = 10.0
"""The derived timeout: max(HANG_MIN_SECONDS, HANG_STEPS × the median step time)."""

COLLECTIVE_MARGIN_SECONDS = 30.0
"""How far below the collective timeout a derived hang timeout stays."""

OFF = 0
"""``hangTimeoutSeconds: 0`` turns hang detection off."""


def derived_timeout(median_step_seconds: float | None) -> float:
    """The timeout when the spec sets none, from the median of the recent step times."""
    return max(HANG_MIN_SECONDS, HANG_STEPS * (median_step_seconds or 0.0))


def hang_timeout(
    configured: float | None,
    median_step_seconds: float | None,
    collective_timeout_seconds: float | None = None,
) -> float | None:
    """Seconds without a finished step after which a worker is hung; None: never (off).

    ``configured`` is ``failurePolicy.hangTimeoutSeconds`` (None: derive it). A derived
    timeout is capped ``COLLECTIVE_MARGIN_SECONDS`` below the collective timeout, but not
    under ``HANG_MIN_SECONDS``; a configured one is taken as it is."""
    if configured is not None:
        return None if configured <= OFF else float(configured)
    timeout = derived_timeout(median_step_seconds)
    if collective_timeout_seconds:
        timeout = min(timeout, collective_timeout_seconds - COLLECTIVE_MARGIN_SECONDS)
    return max(timeout, HANG_MIN_SECONDS)


def parse_configured(raw: str | None) -> float | None:
    """``TORCHKUBE_HANG_TIMEOUT_SECONDS`` as :func:`hang_timeout` takes it: empty or unset
    derives the timeout, a number is taken as seconds (0: off)."""
    if raw is None or raw.strip() in ("", "auto"):
        return None
    return float(raw)
