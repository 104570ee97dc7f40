"""Real torchrun, several processes, gloo on CPU: the trainer survives what a cluster does to it.

- a worker SIGKILLed → torchrun restarts the group → the run ends bit for bit like an
  uninterrupted one;
- a whole agent (pod) stopped with SIGTERM (emergency checkpoint) and later SIGKILLed, each
  time started again → bit for bit the same;
- DDP, FSDP2, HSDP and ZeRO-1 train the tiny model and hand one checkpoint to each other
  across world sizes 2 → 4 → 2;
- elastic: two agents with c10d rendezvous (--nnodes=1:2); one is killed → the survivor goes
  on at world size 1 with the same global batch; it comes back → world size 2 again;
- bad input under torchrun → exit code 3 from the worker, one clear line.

Determinism: CPU kernels with one thread per process and ``deterministic: true``; gloo sums two
ranks' gradients in a fixed order. Resizes and strategy changes reorder floating-point sums,
so those runs are compared with a tolerance instead.
"""

import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from trainer_harness import (
    Launch,
    Torchrun,
    assert_bitwise_equal,
    checkpoint_mib,
    checkpoint_tensors,
    read_progress,
    spec_args,
    staged_mib,
    wait_for,
)

from torchkube.local.ports import free_port

pytestmark = pytest.mark.slow

STEPS = 120
START_TIMEOUT = 180  # torch imports take long on a busy 2-core machine


def recipe(data: Path, **overrides: object) -> list[str]:
    return [*spec_args(data, **{"steps": STEPS, **overrides}), "--checkpoint-interval-steps=10"]


def step_at_least(ckpt: Path, step: int, checkpoint: int = 0) -> bool:
    record = read_progress(ckpt)
    return record.get("step", 0) >= step and (record.get("lastCheckpointStep") or 0) >= checkpoint


@pytest.fixture(scope="module")
def reference(token_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted DDP run at world size 2: what every interrupted run must reproduce."""
    folder = tmp_path_factory.mktemp("reference")
    runner = Torchrun(folder)
    try:
        launch = runner.start(2, recipe(token_data), checkpoint_dir=folder / "ckpt")
        assert launch.wait(START_TIMEOUT + 120) == 0, launch.output()[-4000:]
    finally:
        runner.close()
    record = read_progress(folder / "ckpt")
    assert record["finished"] and record["step"] == STEPS and record["loss"] < 3.0
    # The goodput's checkpoint and data-loading shares: every save held training up a little.
    assert record["checkpointBlockingSeconds"] > 0 and record["dataWaitSeconds"] >= 0
    return folder / "ckpt"


def test_ddp_stages_one_share_of_the_state_per_rank(reference: Path) -> None:
    """Every DDP rank holds the whole state, but async checkpoints copy only a half each to
    host memory at world size 2 (one rank writes each replicated tensor)."""
    log = (reference.parent / "run-0.log").read_text()
    assert staged_mib(log) <= 0.6 * checkpoint_mib(reference / f"step-{STEPS}")


def test_worker_sigkill_resumes_bitwise(
    reference: Path, token_data: Path, tmp_path: Path, torchrun: Torchrun
) -> None:
    ckpt = tmp_path / "ckpt"
    launch = torchrun.start(2, recipe(token_data), checkpoint_dir=ckpt, max_restarts=2)
    wait_for(lambda: step_at_least(ckpt, 25, checkpoint=20), START_TIMEOUT, "step 25", [launch])
    killed_at = read_progress(ckpt)["step"]
    os.kill(launch.workers()[1], signal.SIGKILL)
    assert killed_at < STEPS
    assert launch.wait(START_TIMEOUT + 120) == 0, launch.output()[-4000:]

    record = read_progress(ckpt)
    assert "resumed from" in launch.output() and record["resumes"] == 1
    assert record["loss"] == read_progress(reference)["loss"], f"killed at step {killed_at}"
    assert_bitwise_equal(
        checkpoint_tensors(ckpt / f"step-{STEPS}"), checkpoint_tensors(reference / f"step-{STEPS}")
    )


def test_agent_sigterm_and_sigkill_resume_bitwise(
    reference: Path, token_data: Path, tmp_path: Path, torchrun: Torchrun
) -> None:
    ckpt = tmp_path / "ckpt"
    # 1. SIGTERM to the agent (pod deletion, preemption): workers write an emergency
    #    checkpoint of the step they stop at and exit.
    first = torchrun.start(2, recipe(token_data), checkpoint_dir=ckpt)
    wait_for(lambda: step_at_least(ckpt, 12), START_TIMEOUT, "step 12", [first])
    first.signal(signal.SIGTERM)
    first.wait(60)
    stopped = read_progress(ckpt)
    assert "after the emergency checkpoint" in first.output()
    # the stopping step, or the interval save that was still being written when it came
    assert stopped["step"] - 10 < stopped["lastCheckpointStep"] <= stopped["step"] < STEPS
    assert not stopped["finished"]

    # 2. Started again (the replacement pod), then SIGKILLed with its workers (node loss).
    second = torchrun.start(2, recipe(token_data), checkpoint_dir=ckpt)
    resumed_at = stopped["lastCheckpointStep"]
    wait_for(
        lambda: step_at_least(ckpt, resumed_at + 15, checkpoint=resumed_at + 1),
        START_TIMEOUT,
        "progress after the restart",
        [second],
    )
    second.kill()
    assert f"resumed from {ckpt}/step-{resumed_at} " in second.output()
    assert not read_progress(ckpt)["finished"], "the second launch finished before the kill"

    # 3. Started once more: finishes exactly like the uninterrupted run.
    third = torchrun.start(2, recipe(token_data), checkpoint_dir=ckpt)
    assert third.wait(START_TIMEOUT + 120) == 0, third.output()[-4000:]
    assert read_progress(ckpt)["loss"] == read_progress(reference)["loss"]
    assert read_progress(ckpt)["resumes"] == 2
    assert_bitwise_equal(
        checkpoint_tensors(ckpt / f"step-{STEPS}"), checkpoint_tensors(reference / f"step-{STEPS}")
    )


def test_strategies_train_and_share_one_checkpoint_format(
    reference: Path, token_data: Path, tmp_path: Path, torchrun: Torchrun
) -> None:
    """FSDP2 ×2 → HSDP 2×2 → ZeRO-1 ×2, each resuming the previous one's checkpoint; with a
    constant learning rate the chain is the reference DDP run, up to summation order."""
    ckpt = tmp_path / "ckpt"
    chain = [("fsdp", 2, 20, {}), ("hsdp", 4, 50, {"hsdpShardSize": 2}), ("zero1", 2, STEPS, {})]
    losses = []
    for i, (strategy, nproc, steps, extra) in enumerate(chain):
        args = recipe(token_data, strategy=strategy, steps=steps, **extra)
        launch = torchrun.start(nproc, args, checkpoint_dir=ckpt, name=strategy)
        assert launch.wait(START_TIMEOUT + 120) == 0, launch.output()[-4000:]
        record = read_progress(ckpt)
        assert record["finished"] and record["step"] == steps and record["worldSize"] == nproc
        losses.append(record["loss"])
        # each rank stages one shard: FSDP2's and ZeRO-1's over 2, HSDP's over its 2-rank groups
        assert staged_mib(launch.output()) <= 0.6 * checkpoint_mib(ckpt / f"step-{steps}")
        if i:
            previous, size = chain[i - 1][0], chain[i - 1][1]
            assert f"written at world size {size} with {previous}" in launch.output()
    assert losses[0] < 4.0 and losses[2] < losses[1] < losses[0]  # ln(320) ≈ 5.8 at the start
    assert losses[-1] == pytest.approx(read_progress(reference)["loss"], rel=1e-3)


def test_elastic_shrink_and_grow_keep_the_global_batch(
    token_data: Path, tmp_path: Path, torchrun: Torchrun
) -> None:
    ckpt = tmp_path / "ckpt"
    port = free_port()
    # Short timeouts keep the test quick. keep_alive_max_attempt must stay >= 3: a node's first
    # heartbeat after a round can come two intervals after its last one, and with 2 attempts
    # the node drops itself from its own round (and then never notices a joiner).
    rdzv_conf = (
        "join_timeout=120,last_call_timeout=1,close_timeout=5,keep_alive_interval=1,"
        "keep_alive_max_attempt=3"
    )
    rdzv = ["--nnodes=1:2", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}"]
    args = [
        *spec_args(token_data, steps=1_000_000, logIntervalSteps=2),
        "--checkpoint-interval-steps=10",
    ]

    def start(name: str, host: bool) -> Launch:
        # both agents share one machine, so say which one hosts the rendezvous store
        conf = f"--rdzv-conf={rdzv_conf},is_host={str(host).lower()}"
        return torchrun.start(
            1,
            args,
            checkpoint_dir=ckpt,
            rdzv=[*rdzv, "--rdzv-id=elastic", conf],
            max_restarts=20,
            name=name,
        )

    def world(size: int, after_step: int) -> Callable[[], bool]:
        def check() -> bool:
            r = read_progress(ckpt)
            return r.get("worldSize") == size and r.get("step", 0) >= after_step

        return check

    a = start("agent-a", host=True)
    wait_for(lambda: _port_open(port), 60, "agent A's rendezvous store", [a])
    b = start("agent-b", host=False)
    wait_for(
        lambda: world(2, 12)() and step_at_least(ckpt, 12, checkpoint=10),
        START_TIMEOUT,
        "training at world size 2",
        [a, b],
    )

    killed_step, killed = read_progress(ckpt)["step"], time.monotonic()
    b.kill()  # the whole agent and its worker, like a lost node
    wait_for(world(1, killed_step + 1), START_TIMEOUT, "training at world size 1", [a])
    shrink_seconds = time.monotonic() - killed
    wait_for(world(1, read_progress(ckpt)["step"] + 10), 120, "steps at world size 1", [a])

    b2 = start("agent-b-again", host=False)
    wait_for(
        world(2, read_progress(ckpt)["step"] + 10), START_TIMEOUT, "world size 2 again", [a, b2]
    )
    for agent in (a, b2):
        agent.signal(signal.SIGTERM)
    for agent in (a, b2):
        agent.wait(90)

    log = a.output() + b2.output()  # rank 0, who logs, may sit on either agent
    assert (
        "world size changed 2 → 1: gradient accumulation 2 → 4 micro-steps, "
        "global batch stays 16 sequences" in log
    )
    assert "world size changed 1 → 2: gradient accumulation 4 → 2 micro-steps" in log
    assert "fenced off" not in log
    last = read_progress(ckpt)
    final = checkpoint_tensors(ckpt / f"step-{last['lastCheckpointStep']}")
    # every step consumed exactly one global batch, whatever the world size at the time
    assert final["train.consumed_samples"] == final["train.step"] * 16
    # the emergency checkpoint on the way out: of the last step, or of the interval save that
    # was still being written when the stop came
    assert last["step"] - 10 < final["train.step"] <= last["step"]
    print(f"shrink: training again at world size 1 {shrink_seconds:.1f}s after the kill")


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_bad_input_under_torchrun_is_permanent(
    token_data: Path, tmp_path: Path, torchrun: Torchrun
) -> None:
    marker = tmp_path / "permanent-error"
    launch = torchrun.start(
        2,
        spec_args(tmp_path / "missing"),
        checkpoint_dir=tmp_path / "ckpt",
        max_restarts=0,
        env={"TORCHKUBE_PERMANENT_ERROR_FILE": str(marker)},
    )
    assert launch.wait(START_TIMEOUT) != 0
    out = launch.output()
    assert "torchkube-trainer: error: dataPath: token file" in out and "exitcode  : 3" in out
    assert "does not exist" in marker.read_text()
