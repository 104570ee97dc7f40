"""torch's process-group backends, registered as this module is imported: the worker server
imports it (``torchkube.elastic.warm.PRELOAD``) so that every worker it forks inherits the
registration.

torch registers even its own backends through entry points
(``torch.distributed.backends``): a process's first group of a backend reads the metadata of
every installed distribution to find the registrar — 126 files in the trainer's environment,
7 ms in a fresh process, about twice that in one just forked (its pages copied on write) —
and a warm worker is such a process at every start, every recovery. The registration itself
only records torch's constructor for the backend: no device, thread or socket is touched, so
the server stays safe to fork.
"""

import contextlib

from torch.distributed.distributed_c10d import Backend

WORKER_BACKENDS = ("gloo",)
"""Every job's: the built-in trainer's control and checkpoint groups, and a CPU job's all.
Not nccl: its registration reads ``TORCH_DIST_USE_NCCL2`` to choose torch's NCCL process
group, and a worker's script may set that itself before its first group — registered in the
server, the choice would be made before the script ran."""


def register() -> None:
    """Register :data:`WORKER_BACKENDS` now; one torch cannot register (a build without it)
    is left to the worker that asks for it, which fails then as it would have."""
    for name in WORKER_BACKENDS:
        with contextlib.suppress(Exception):
            Backend._ensure_backend_registered(name)


register()
