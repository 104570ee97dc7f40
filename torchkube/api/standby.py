"""Which running worker of a live-recovery job stands by: one rule for the operator and the
local runner.

Under ``failurePolicy.recovery: live`` with ``replicas.spares``, a running worker pod either
trains (its replica group is in torchft's quorum) or stands by outside it. Only the first
carries the job when another group is lost: a loss beside nothing but standbys leaves no live
peer to copy from, and the standby that joins starts from the checkpoint — a restart, not a
group's loss. The writer group's progress record names the quorum's slots
(``LiveProgress.training_slots``); a pod created after that record was written may have joined
since, so it counts as training until a newer record says otherwise.
"""

from datetime import datetime

from torchkube.api.contract import ProgressReport
from torchkube.api.times import parse_time


def stands_by(slot: int | None, created: datetime | None, progress: ProgressReport | None) -> bool:
    """Whether the running worker of ``slot``, created at ``created``, stood by outside the
    quorum when ``progress`` was written (False whenever that is not known)."""
    live = progress.live if progress is not None else None
    written = parse_time(progress.updated) if progress is not None else None
    if live is None or not live.training_slots or written is None:
        return False
    if slot is None or created is None or created >= written:
        return False
    return slot not in live.training_slots
