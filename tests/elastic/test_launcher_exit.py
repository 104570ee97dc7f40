"""The launcher's exit (torchkube/elastic/launch.py): its result must be its exit code, whatever
native threads torch left running. Under CPU load an agent once printed its permanent error and
then died of SIGABRT in the interpreter's finalisation ("terminate called without an active
exception": a C++ thread destroyed while joinable), so the operator saw a crash to retry instead
of exit 3. Each case runs in a fresh interpreter, as an agent is one."""

import subprocess
import sys

# A thread the interpreter would wait for at exit, standing in for a native one it would
# tear down: either way, finalisation must not run.
AGENT = """
import threading
from torchkube.elastic.launch import exit_with
threading.Thread(target=threading.Event().wait).start()
print("result printed", flush=False)
exit_with({code})
"""


def _agent(code: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", AGENT.format(code=code)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_exit_code_is_the_result_and_finalisation_is_skipped() -> None:
    for code in (0, 3):
        agent = _agent(code)
        assert agent.returncode == code, agent.stderr
        assert agent.stdout == "result printed\n", "output lost on the way out"
