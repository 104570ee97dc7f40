"""Live recovery: the checkpoint folder belongs to the writer group alone. Every group of a
job that starts from the volume reads the newest checkpoint; if the group that does not
write also claimed the folder while reading, it could do so after the writer (on a loaded
machine it is a step behind), and the writer's own next save would be fenced off."""

from types import SimpleNamespace
from typing import Any

from torchkube.trainer.live import LiveLoop


class Folder:
    def __init__(self) -> None:
        self.claims = 0

    def claim(self) -> None:
        self.claims += 1

    def load(self) -> bool:
        return False


def loop_at_start(rank: int) -> tuple[Any, Folder]:
    """A group's loop at its first quorum (step 0), its place in the quorum ``rank``."""
    folder = Folder()
    loop: Any = LiveLoop.__new__(LiveLoop)
    loop.manager = SimpleNamespace(
        current_step=lambda: 0, num_participants=lambda: 2, participating_rank=lambda: rank
    )
    loop.ckpt, loop.writer, loop.split = folder, False, (2, rank)
    loop.progress = SimpleNamespace(enabled=False)
    loop.info = SimpleNamespace(is_main=True)
    return loop, folder


def test_only_the_writer_group_claims_the_folder_when_a_job_starts_from_the_volume() -> None:
    for rank, claims in ((1, 0), (0, 1)):
        loop, folder = loop_at_start(rank)
        loop._resume_from_volume()
        loop._arrange(reporter=None)  # the split is unchanged: nothing else to arrange
        assert folder.claims == claims, f"quorum rank {rank}"
