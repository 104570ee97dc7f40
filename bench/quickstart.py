"""The README's quick start, recorded: its first command run here, its output as a terminal
shows it.

Run: ``python -m bench.quickstart`` (≈ 15 s on 2 idle cores). Runs ``torchkube run
examples/quickstart.yaml --fresh --chaos-at-step 70`` in a scratch folder under a pseudo
terminal (so the progress line is redrawn in place, as a reader sees it), and writes
``bench/results/quickstart.json``: the output, the wall time, the time lost to the kill and
the run-average throughput the command printed, and the machine and its load.
``python -m bench.report`` puts the output into README.md, so the sample there is a
recording, never typed by hand.
"""

from __future__ import annotations

import argparse
import os
import pty
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import ROOT, Results, load_average, log

README_COMMAND = "./hack/torchkube run examples/quickstart.yaml --fresh --chaos-at-step 70"
_ARGS = ["examples/quickstart.yaml", "--fresh", "--chaos-at-step", "70"]
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


def run_in_terminal(command: list[str], cwd: Path) -> tuple[int, str]:
    """Run ``command`` with a pseudo terminal as its stdout and stderr; its exit code and
    everything it wrote."""
    master, slave = pty.openpty()
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        command,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": path},  # this checkout's torchkube
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the command's end closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(), b"".join(chunks).decode(errors="replace")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.quickstart", description=__doc__)
    parser.parse_args(argv)
    results = Results("quickstart", README_COMMAND)
    with tempfile.TemporaryDirectory(prefix="torchkube-quickstart-") as scratch:
        (Path(scratch) / "examples").symlink_to(ROOT / "examples")
        log(f"running {README_COMMAND}")
        code, raw = run_in_terminal(
            [sys.executable, "-m", "torchkube.cli", "run", *_ARGS], Path(scratch)
        )
    shown = as_shown(raw)
    print(shown)
    if code != 0:
        raise SystemExit(f"the quick start failed (exit {code}); nothing recorded")
    load = load_average()
    for name, (pattern, unit) in _SUMMARY.items():
        found = pattern.search(shown)
        if found is None:
            raise SystemExit(f"no {name} in the quick start's summary; nothing recorded")
        results.figure(name, unit).add(float(found[1].replace(",", "")), load)
    results.extra["output"] = shown
    results.notes.append(
        "the README's quick-start command, once, in a scratch folder under a pseudo terminal; "
        "the output is README.md's sample (python -m bench.report)"
    )
    results.write()


if __name__ == "__main__":
    main()
