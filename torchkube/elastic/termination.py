"""The worker container's termination message: what the kubelet shows the operator once the
container ended (``torchkube run`` gives each worker a file of its own instead).

The launcher writes there why it ended and the trainer that training finished. While the
workers train, one line of the message is the pod's own record: the first step its workers
committed since the pod's last failure (``COMMITTED_STEP``). The heartbeat writes it at the
first step (:meth:`torchkube.elastic.heartbeat.Heartbeat.beat`), not at the end, so the line is
there whatever ends the pod — a SIGKILL, the OOM killer of the whole container, which leave
the launcher no time to write; the launcher's own report (:func:`write`) keeps it, and an
in-place restart of the workers takes it (:func:`take_committed`) into its record, so that the
next round's line is its own. The operator reads it to tell a replica group that crash-loops
(lost again before committing a step) from one lost now and then while it trains.

Best effort, like the message itself: a file that cannot be written is left alone. No torch.
"""

import contextlib
import os
from pathlib import Path

from torchkube.api.contract import (
    TERMINATION_LOG,
    Env,
    committed_step,
    committed_step_line,
    without_committed_step,
)

LIMIT = 4096
"""What Kubernetes keeps of a termination message (bytes; the text here is ASCII mostly)."""


def path() -> Path | None:
    """Where the message goes: ``TORCHKUBE_TERMINATION_LOG`` (``torchkube run`` points it at a
    file of its own per worker), else Kubernetes' default file where it exists (in a pod);
    None elsewhere (a launcher run by hand: stderr is enough)."""
    configured = os.environ.get(Env.TERMINATION_LOG)
    if configured:
        return Path(configured)
    return TERMINATION_LOG if TERMINATION_LOG.exists() else None


def _read(where: Path) -> str:
    try:
        return where.read_text()
    except (OSError, UnicodeDecodeError):
        return ""


def _write(where: Path, committed: int | None, message: str) -> None:
    """As much of the end of ``message`` as fits, then the committed-step line, which the
    operator takes out before it quotes the message. Written in place: Kubernetes
    bind-mounts the file, so it cannot be replaced."""
    message = message.rstrip("\n")
    tail = f"{committed_step_line(committed)}\n" if committed is not None else ""
    if message:
        message = message[-(LIMIT - len(tail) - 1) :] + "\n"
    with contextlib.suppress(OSError):
        where.write_text(message + tail)


def write(message: str) -> None:
    """``message`` as the termination message, the committed-step line kept if it has one."""
    where = path()
    if where is not None:
        _write(where, committed_step(_read(where)), message)


def mark_committed(step: int) -> None:
    """The workers committed ``step``, their first since the pod's last failure."""
    where = path()
    if where is not None:
        _write(where, step, without_committed_step(_read(where)))


def take_committed() -> int | None:
    """The first step the workers committed since the pod's last failure (None: none), taken
    out of the message: they are restarted in place (or a launcher starts on a file an earlier
    one wrote), and the next round says its own."""
    where = path()
    if where is None:
        return None
    text = _read(where)
    step = committed_step(text)
    if step is not None:
        _write(where, None, without_committed_step(text))
    return step
