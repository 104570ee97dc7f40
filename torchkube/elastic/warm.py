"""Warm workers: every round's workers are forked from a process that imported torch once.

torchrun starts each worker of each rendezvous round as a fresh interpreter
(``python -u -m module``). Importing torch and the trainer takes seconds — 2–3 s on an idle
2-core machine, 4–6 s under load — and every pod pays it again at every re-rendezvous: after
any failure, on every resize, and a hot spare when it takes a place. The launcher instead
starts a multiprocessing *forkserver* at once, which imports torch (and, for the built-in
trainer, its modules) while the agent joins the rendezvous or stands by as a spare, and has
torchrun run the same module or script as a function in processes forked from it
(``--start-method=forkserver``, as torchrun's own ``--run-path`` does for scripts). A worker
then starts in milliseconds, with the same environment, arguments, signals and exit codes.

The server is single-threaded and never initialises CUDA, so forking it is as safe as a
DataLoader's workers. ``TORCHKUBE_WARM_WORKERS=0`` gives torchrun's fresh interpreters back.
"""

import multiprocessing
import os
import runpy
import sys
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing import forkserver
from typing import Any

from torchkube.api.contract import Env
from torchkube.elastic import worker_store

BUILTIN_TRAINER = "torchkube.trainer"
PRELOAD = [
    "torch",
    "torch.distributed",
    "torch._dynamo",
    "torch._inductor.config",
    "torchkube.elastic.backends",
]
"""What any torch training worker imports before its first step. The compiler stack is among
it: DDP's constructor imports ``torch._dynamo`` and ``torch.use_deterministic_algorithms``
imports ``torch._inductor.config`` (with sympy and triton): imported by each worker after
its fork, they would be most of every worker's start, every recovery. And the process-group
backends, registered (:mod:`torchkube.elastic.backends`). None of it initialises CUDA or
starts a thread, so the server stays safe to fork."""
TRAINER_PRELOAD = ["torchkube.trainer.train", "torchkube.trainer.entrypoint"]
"""What the built-in trainer imports before its first step (no CUDA, no process group)."""


def enabled() -> bool:
    return os.environ.get(Env.WARM_WORKERS, "1") != "0"


def module_of(argv: Sequence[str]) -> str | None:
    """The module torchrun runs (``-m MODULE``), if it runs one."""
    for index, arg in enumerate(argv[:-1]):
        if arg in ("-m", "--module"):
            return argv[index + 1]
    return None


def start(argv: Sequence[str]) -> None:
    """Start the forkserver now, preloading what the workers will import."""
    module = module_of(argv)
    preload = PRELOAD + (TRAINER_PRELOAD if module == BUILTIN_TRAINER else []) + launcher_modules()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")  # what torchrun's `python -u` gave
    multiprocessing.set_forkserver_preload(preload)
    forkserver.ensure_running()


def launcher_modules() -> list[str]:
    """The modules of the launcher's top-level package it imported, when it runs as
    ``python -m``: each forked worker runs the launcher's main module again as
    ``__mp_main__`` (multiprocessing's preparation of a child), importing them — tens of
    milliseconds of every worker's start, every recovery — unless the server imported them
    before it forked. Not the main module itself: found imported, its second run warns in
    every worker's log. The package's modules only define at import: importing them starts
    nothing."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    main = getattr(spec, "name", None)
    if not main or main.endswith("__main__") or "." not in main:  # as multiprocessing skips
        return []
    package = main.split(".")[0] + "."
    return sorted(n for n in list(sys.modules) if n.startswith(package) and n != main)


def when_ready(then: Callable[[float, BaseException | None], None]) -> None:
    """Call ``then(seconds, error)`` from a thread once the started server can fork a worker
    at once.

    The server imports its preload before it takes its first request, so a process forked
    from it and ended is the answer; ``seconds`` is how long that took. A server that cannot
    fork answers too, with ``error``: the workers will fail on it visibly, and the pod must
    not wait for a warmth that never comes."""

    def wait() -> None:
        began, error = time.monotonic(), None
        try:
            probe = multiprocessing.get_context("forkserver").Process(target=_forked, daemon=True)
            probe.start()
            probe.join()
        except Exception as failed:
            error = failed
        then(time.monotonic() - began, error)

    threading.Thread(target=wait, name="torchkube-warm-ready", daemon=True).start()


def _forked() -> None:
    """What :func:`when_ready`'s process runs: nothing; being forked was the point."""


SERVER_MARK = b"multiprocessing.forkserver"
HELPER_MARKS = (SERVER_MARK, b"multiprocessing.resource_tracker")


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def workers_of(launcher: int, children: dict[int, list[int]]) -> list[int]:
    """The worker processes a launcher runs now, from a parent → children map: the children
    of its forkserver (warm), or its own children that are not multiprocessing's helpers.

    :func:`when_ready`'s probe is a child of the forkserver too, for the moment between the
    end of the server's imports and the launcher's ``workers start warm`` record: a caller
    that asks before that record may see it as a worker."""
    mine = children.get(launcher, [])
    servers = [pid for pid in mine if SERVER_MARK in _cmdline(pid)]
    forked = [pid for server in servers for pid in children.get(server, [])]
    direct = [pid for pid in mine if not any(m in _cmdline(pid) for m in HELPER_MARKS)]
    return sorted(forked + direct)


def run_module(module: str, *argv: str) -> None:
    """``python -m module argv...`` inside a forked worker."""
    worker_store.connect_promptly()
    sys.argv = [module, *argv]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def run_script(script: str, *argv: str) -> None:
    """``python script argv...`` inside a forked worker."""
    worker_store.connect_promptly()
    sys.argv = [script, *argv]
    runpy.run_path(script, run_name="__main__")


def as_function(
    config: Any, cmd: Callable[..., Any] | str, cmd_args: list[str]
) -> tuple[Any, Callable[..., Any] | str, list[str]]:
    """torchrun's ``python -u [-m] target args`` as a function entrypoint forked from the
    server; anything else (``--no-python``, ``--run-path``) unchanged."""
    if not isinstance(cmd, str) or cmd != os.getenv("PYTHON_EXEC", sys.executable):
        return config, cmd, cmd_args
    if not cmd_args or cmd_args[0] != "-u":
        return config, cmd, cmd_args
    rest = cmd_args[1:]
    config.start_method = "forkserver"
    if rest and rest[0] == "-m":
        return config, run_module, rest[1:]
    return config, run_script, rest


def patch_torchrun() -> None:
    """Route torchrun's ``run()`` through :func:`as_function` (once per process)."""
    import torch.distributed.run as torchrun

    module: Any = torchrun
    if getattr(module, "_torchkube_warm", False):
        return
    original = module.config_from_args

    def config_from_args(args: Any) -> Any:
        return as_function(*original(args))

    module.config_from_args = config_from_args
    module._torchkube_warm = True
