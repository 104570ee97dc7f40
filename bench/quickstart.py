"""The README's quick start, recorded: its first command run here, its output as a terminal
shows it, and the run its picture is drawn from.

Run: ``python -m bench.quickstart`` (≈ 1 min on 2 cores). Runs ``torchkube run
examples/quickstart.yaml --fresh --chaos-at-step 70`` in a scratch folder under a pseudo
terminal (so the progress line is redrawn in place, as a reader sees it), and writes
``bench/results/quickstart.json``: the output, the wall time, the time lost to the kill and
the run-average throughput the command printed, the machine and its load, and the run as
``torchkube plot`` reads it from the run dir (``Run.to_wire``). ``python -m bench.report``
puts the output into README.md and draws ``docs/images/quickstart.png`` from that same record,
so the sample and the picture are one run, never typed or drawn by hand; the recording stops
if the two disagree on the time lost.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pty
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import ROOT, Results, load_average, log
from torchkube.local.plot import Run, read_run, render

README_COMMAND = "./hack/torchkube run examples/quickstart.yaml --fresh --chaos-at-step 70"
_ARGS = ["examples/quickstart.yaml", "--fresh", "--chaos-at-step", "70"]
RUN_DIR = Path("torchkube-runs") / "quickstart"
"""Where the command leaves its run, under the folder it runs in."""
IMAGE = ROOT / "docs" / "images" / "quickstart.png"
"""The README's picture of the run (and docs/metrics.md's)."""
_SUMMARY = {
    "wall time": (re.compile(r"^\s+wall time\s+([0-9.]+)s$", re.M), "s"),
    "time lost to the kill": (re.compile(r"^\s+time lost\s+([0-9.]+)s", re.M), "s"),
    "throughput, run average": (
        re.compile(r"^\s+throughput\s+([0-9,]+) tokens/s over the run", re.M),
        "tok/s",
    ),
}


def as_shown(raw: str) -> str:
    """What a terminal shows for ``raw``: a line redrawn after a carriage return keeps its last
    drawing, and erase-to-end-of-line codes leave nothing behind."""
    text = raw.replace("\r\n", "\n").replace("\033[K", "")
    return "\n".join(line.rsplit("\r", 1)[-1] for line in text.split("\n")).strip("\n") + "\n"


def run_in_terminal(command: list[str], cwd: Path, timeout: float | None = None) -> tuple[int, str]:
    """Run ``command`` with a pseudo terminal as its stdout and stderr; its exit code and
    everything it wrote. Past ``timeout`` seconds its whole process group is killed (the
    exit code then says SIGKILL): a hung run leaves nothing behind."""
    master, slave = pty.openpty()
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        command,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": path},  # this checkout's torchkube
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    os.close(slave)
    deadline = None if timeout is None else time.monotonic() + timeout
    chunks = []
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and (left <= 0 or not select.select([master], [], [], left)[0]):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            break
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the command's end closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(), b"".join(chunks).decode(errors="replace")


def draw(body: dict[str, Any], path: Path = IMAGE) -> Path:
    """The picture of the recorded run (``body``: the record), with the title the README's
    sample shows in its summary."""
    return render(Run.from_wire(body["extra"]["run"]), path)


@dataclass(frozen=True)
class Ran:
    """One run of the README's quick-start command."""

    code: int
    shown: str
    """Its output as a terminal shows it."""
    run: Run | None
    """The run as ``torchkube plot`` reads it (None if the command failed)."""
    seconds: float
    """From the command's start to its exit: the reader's wait, an exit that lingers after
    the summary included."""


def run_quickstart(timeout: float | None = None) -> Ran:
    """The README's quick-start command once, in a scratch folder under a pseudo terminal;
    killed, with everything it started, past ``timeout`` seconds."""
    with tempfile.TemporaryDirectory(prefix="torchkube-quickstart-") as scratch:
        (Path(scratch) / "examples").symlink_to(ROOT / "examples")
        log(f"running {README_COMMAND}")
        started = time.monotonic()
        code, raw = run_in_terminal(
            [sys.executable, "-m", "torchkube.cli", "run", *_ARGS], Path(scratch), timeout
        )
        seconds = time.monotonic() - started
        drawn = read_run(Path(scratch) / RUN_DIR) if code == 0 else None
    return Ran(code, as_shown(raw), drawn, seconds)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.quickstart", description=__doc__)
    parser.parse_args(argv)
    results = Results("quickstart", README_COMMAND)
    ran = run_quickstart()
    code, shown, drawn = ran.code, ran.shown, ran.run
    print(shown)
    if code != 0 or drawn is None:
        raise SystemExit(f"the quick start failed (exit {code}); nothing recorded")
    load = load_average()
    for name, (pattern, unit) in _SUMMARY.items():
        found = pattern.search(shown)
        if found is None:
            raise SystemExit(f"no {name} in the quick start's summary; nothing recorded")
        results.figure(name, unit).add(float(found[1].replace(",", "")), load)
    lost = _SUMMARY["time lost to the kill"][0].search(shown)
    if lost is None or f"{drawn.lost_seconds:.1f}" != lost[1]:
        raise SystemExit(
            f"the picture would say {drawn.lost_seconds:.1f} s lost and the summary "
            f"{lost[1] if lost else '?'} s; nothing recorded"
        )
    results.extra["output"] = shown
    results.extra["run"] = drawn.to_wire()
    results.notes.append(
        "the README's quick-start command, once, in a scratch folder under a pseudo terminal; "
        "the output is README.md's sample and the run its picture, docs/images/quickstart.png "
        "(python -m bench.report)"
    )
    results.write()


if __name__ == "__main__":
    main()
