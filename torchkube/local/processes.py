"""Process trees: a local "pod" is a torchrun agent plus the workers it started.

torchrun starts each worker in a session of its own, so killing the agent's process group
leaves the workers running. A pod's death takes all of them, so we walk the tree instead.
"""

import contextlib
import os
import signal
from pathlib import Path


def children_of() -> dict[int, list[int]]:
    """Parent pid → child pids, read from /proc in one pass."""
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # the command name may contain spaces and parentheses: the ppid follows the last ')'
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def descendants(pid: int) -> list[int]:
    tree = children_of()
    found: list[int] = []
    stack = [pid]
    while stack:
        for child in tree.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def kill_tree(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal ``pid`` and every process below it, children first seen before the parent dies."""
    for target in [*descendants(pid), pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(target, sig)


def stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped by a signal (state ``T`` in ``/proc/<pid>/stat``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] == "T"
