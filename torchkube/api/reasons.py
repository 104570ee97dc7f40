"""Why a worker (or the rendezvous store) stopped: the failure classes of ``status.failures``.

Each reason is written once, in the list of its kind, so the CRD's enum, the metrics' label
values and the failure policy's free-by-default set cannot disagree: ``FailureReason`` is the
union of the two kinds and ``INFRASTRUCTURE_REASONS`` is read off the first.
"""

from typing import Literal, get_args

InfrastructureReason = Literal[
    "NodeLost",
    "Preempted",
    "Evicted",
    "Deleted",
    "RendezvousStoreLost",
    "RendezvousFailed",
    "JoinTimeout",
    "Straggler",
]
"""Causes outside the training code: they restart training but spend nothing of
``maxRestarts`` unless ``countInfrastructureFailures``."""

CountedReason = Literal["ExitCode", "OOMKilled", "InPlaceRestart", "Hang", "Unknown"]
"""Causes the training code may be behind: they spend ``maxRestarts``. A hang is one: a
deadlock in the training code hangs too, and must not loop for ever."""

FailureReason = Literal[CountedReason, InfrastructureReason]
"""Every failure class the failure policy acts on."""

INFRASTRUCTURE_REASONS: frozenset[FailureReason] = frozenset(get_args(InfrastructureReason))
