"""What a job has spent of its failure budget, as its status records it.

The operator keeps the ledger in the job's status; ``torchkube run`` keeps one in memory. Both
take the ledger the failure policy folded a batch of new failures into
(``torchkube.policy.accounting.Outcome.ledger``, through :meth:`Ledger.after`), so the history
they decide on — how much of it is kept, what a replica group's previous failure was
(:meth:`Ledger.last_failure_of`) — is the same on a laptop and in a cluster. No Kubernetes
here.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from torchkube.api.status import MAX_FAILURE_HISTORY, FailureRecord, TrainingJobStatus


@dataclass(frozen=True)
class Ledger:
    """What a job has spent so far, as its status records it."""

    restarts: int = 0
    """Incidents: restarts of training from a checkpoint (``status.restarts``)."""
    counted: int = 0
    """What was spent of ``maxRestarts`` (``status.restartsCountTowardsMax``)."""
    history: Sequence[FailureRecord] = ()
    """The newest failures, oldest first (``status.failures``)."""
    group_losses: int = 0
    """Replica groups lost under recovery live (``status.replicaGroupLosses``)."""

    @classmethod
    def of(cls, status: TrainingJobStatus) -> "Ledger":
        return cls(
            status.restarts,
            status.restarts_count_towards_max,
            tuple(status.failures),
            status.replica_group_losses,
        )

    def after(
        self, restarts: int, counted: int, group_losses: int, records: Sequence[FailureRecord]
    ) -> "Ledger":
        """The ledger once ``records`` are written, with these totals: the history keeps the
        newest ``MAX_FAILURE_HISTORY`` records, as ``status.failures`` does."""
        history = (*self.history, *records)[-MAX_FAILURE_HISTORY:]
        return Ledger(restarts, counted, history, group_losses)

    def last_failure_of(self, slot: int) -> FailureRecord | None:
        """The newest recorded failure of worker slot ``slot`` (its replica group under
        recovery live), if the history still holds one."""
        return next((r for r in reversed(self.history) if r.replica_index == slot), None)
