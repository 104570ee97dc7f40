"""A launcher says its workers can start warm (``Env.WARM_FILE``, which a worker pod's startup
probe waits for, and so ``status.spares``) only once its worker server imported what they
need: a spare counted while its server still imported torch took its place 4 s late."""

import os
import subprocess
import sys
import time
from pathlib import Path

from torchkube.elastic.warm import BUILTIN_TRAINER

SLOW_IMPORT_SECONDS = 1.5

CALLER = """
import multiprocessing, sys, time
from multiprocessing import forkserver
from pathlib import Path
from torchkube.elastic import warm

multiprocessing.set_forkserver_preload(["slow_import"])
forkserver.ensure_running()

def ready(seconds, error):
    assert error is None, error
    Path(sys.argv[1]).write_text(f"{time.time()} {seconds}")

warm.when_ready(ready)
time.sleep(60)
"""


def test_warmth_is_announced_once_the_server_imported_its_preload(tmp_path: Path) -> None:
    (tmp_path / "slow_import.py").write_text(
        "import pathlib, sys, time\n"
        f"time.sleep({SLOW_IMPORT_SECONDS})\n"
        f"pathlib.Path({str(tmp_path / 'imported')!r}).write_text(str(time.time()))\n"
    )
    announced = tmp_path / "announced"
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    caller = subprocess.Popen(
        [sys.executable, "-c", CALLER, str(announced)], env={**os.environ, "PYTHONPATH": path}
    )
    try:
        deadline = time.monotonic() + 60
        while not announced.exists() or not announced.read_text():
            assert caller.poll() is None, f"the caller ended with {caller.returncode}"
            assert time.monotonic() < deadline, "warmth never announced"
            time.sleep(0.05)
        at, seconds = (float(x) for x in announced.read_text().split())
        imported_at = float((tmp_path / "imported").read_text())
        assert at >= imported_at, "announced before the server finished its import"
        assert seconds >= SLOW_IMPORT_SECONDS
    finally:
        caller.kill()
        caller.wait()


def forked_worker_main(
    target: str, printed: str, module: str = BUILTIN_TRAINER, first: str = ""
) -> str:
    """The main of a program that starts the worker server as a launcher of ``module``
    would, runs ``target(queue)`` in one worker forked from it, and prints ``printed``, an
    expression of what the worker put in the queue (``got``)."""
    return f"""
if __name__ == "__main__":
    {first}
    warm.start(["-m", "{module}"])
    context = get_context("forkserver")
    queue = context.Queue()
    worker = context.Process(target={target}, args=(queue,))
    worker.start()
    got = queue.get(timeout=120)
    print({printed})
    worker.join()
"""


WORKER_START = """
import os, sys, tempfile
from multiprocessing import forkserver, get_context, set_forkserver_preload
from torchkube.elastic import warm

def start_training(queue):
    before = set(sys.modules)
    import torch
    import torch.distributed as dist
    torch.use_deterministic_algorithms(True)  # the trainer's `deterministic: true`
    store = dist.FileStore(tempfile.mktemp(), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    dist.destroy_process_group()
    queue.put(sorted(set(sys.modules) - before))
"""
WORKER_START += forked_worker_main("start_training", '"\\n".join(got)')
HEAVY = ("torch._dynamo", "torch._inductor", "sympy", "triton")


def test_a_warm_worker_starts_training_without_importing_the_compiler(tmp_path: Path) -> None:
    """A worker forked from the server imported torch's compiler stack itself (DDP's
    constructor, ``use_deterministic_algorithms``): 0.6–0.7 s of every start and recovery."""
    script = tmp_path / "worker_start.py"
    script.write_text(WORKER_START)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    imported = done.stdout.split()
    assert not [m for m in imported if m.startswith(HEAVY)], imported


LAUNCHER = """
import os
from launcher import helper  # stands for the launcher's own modules
from multiprocessing import get_context
from torchkube.elastic import warm

def where_imported(queue):
    queue.put("worker" if helper.IMPORTED_IN == os.getpid() else "server")
"""
LAUNCHER += forked_worker_main(
    "where_imported",
    "got",
    module="a.module",
    first="import launcher.main  # the main module, imported by its name too: never preloaded",
)


def test_a_warm_worker_finds_the_launchers_modules_imported(tmp_path: Path) -> None:
    """Each worker forked from the server runs the launcher's main module again (as
    ``__mp_main__``): the launcher's modules (torchkube.elastic's watchdog, rendezvous
    wrappers, ports) were imported by every worker itself, in every recovery. The main
    module itself is left to the worker: found imported, its run warns."""
    package = tmp_path / "launcher"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "main.py").write_text(LAUNCHER)
    (package / "helper.py").write_text("import os\nIMPORTED_IN = os.getpid()\n")
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-m", "launcher.main"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["server"], done.stdout
    assert "found in sys.modules" not in done.stderr, done.stderr[-3000:]  # runpy's warning


GROUPS_START = """
import importlib.metadata, tempfile
from multiprocessing import get_context
from torchkube.elastic import warm

def start_groups(queue):
    scans = []
    entry_points = importlib.metadata.entry_points

    def counted(**selection):
        scans.append(selection)
        return entry_points(**selection)

    importlib.metadata.entry_points = counted
    import torch.distributed as dist
    store = dist.FileStore(tempfile.mktemp(), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    dist.new_group(backend="gloo")
    dist.destroy_process_group()
    queue.put(len(scans))
"""
GROUPS_START += forked_worker_main("start_groups", "got")


def test_a_warm_workers_process_groups_read_no_package_metadata(tmp_path: Path) -> None:
    """torch registers even gloo through an entry point, found by reading the metadata of
    every installed distribution at a process's first group of that backend: 7-14 ms of
    every warm worker's start (the server never made a group), every recovery."""
    script = tmp_path / "groups_start.py"
    script.write_text(GROUPS_START)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["0"], "the worker scanned entry points for its backend"
