"""How fast an agent reports a failed worker (torchkube/elastic/torchrun.py). torch formats an
exception in its log records by first importing ``torch._dynamo``, and a warm worker's failure
is such a record: the survivor's agent spent 1.6–2 s importing the compiler stack before it
restarted the round. Each case runs in a fresh interpreter, as an agent is one."""

import subprocess
import sys

AGENT = """
import logging, sys
import torch
from torchkube.elastic import torchrun
if {light}:
    torchrun.report_failures_lightly()
log = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
log.setLevel(logging.INFO)
try:
    raise RuntimeError("process 0 terminated with exit code 1")
except RuntimeError:
    log.exception("failed (exitcode: %s) local_rank: %s", 1, 0)
print("dynamo imported:", "torch._dynamo" in sys.modules)
"""


def _agent(light: bool) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", AGENT.format(light=light)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )


def test_a_worker_failure_is_logged_with_its_traceback_without_importing_the_compiler() -> None:
    agent = _agent(light=True)
    assert "dynamo imported: False" in agent.stdout, agent.stderr
    assert "failed (exitcode: 1) local_rank: 0" in agent.stderr
    assert "Traceback (most recent call last)" in agent.stderr
    assert "RuntimeError: process 0 terminated with exit code 1" in agent.stderr


def test_torchs_own_formatter_imports_the_compiler_for_it() -> None:
    """Why the filter exists: if torch stops doing this, it can go."""
    assert "dynamo imported: True" in _agent(light=False).stdout
