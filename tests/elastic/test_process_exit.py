"""How torchkube's processes end (torchkube/process_exit.py): their result must be their exit
code, whatever native threads torch left running. Under CPU load a launcher once printed its
permanent error and then died of SIGABRT in the interpreter's finalisation ("terminate called
without an active exception": a C++ thread destroyed while joinable), so the operator saw a
crash to retry instead of exit 3; a trainer's rank did the same after its result. Each case
runs in a fresh interpreter, as a launcher or a trainer is one."""

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


def _run(script: str, code: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script.format(code=code)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_exit_code_is_the_result_and_finalisation_is_skipped() -> None:
    for code in (0, 3):
        agent = _run(AGENT, code)
        assert agent.returncode == code, agent.stderr
        assert agent.stdout == "result printed\n", "output lost on the way out"


# The trainer's failed exit: at once, exit hooks skipped (a checkpoint thread may be stuck on a
# dead peer).
TRAINER = """
import atexit
import threading
from torchkube.trainer import exit_with
threading.Thread(target=threading.Event().wait).start()
atexit.register(lambda: print("exit hook ran", flush=True))
print("result printed", flush=False)
exit_with({code})
"""


def test_a_failed_trainer_exits_at_once() -> None:
    trainer = _run(TRAINER, 1)
    assert trainer.returncode == 1, trainer.stderr
    assert trainer.stdout == "result printed\n"
