"""Real torchrun, gloo on CPU: tensor parallelism × data parallelism on a Llama-family model.

- ``tensor_parallel_worker.py``, 4 processes: tensor 2 × data 2 with FSDP2, HSDP and DDP over
  the data dimension, with each activation-checkpointing mode, built on the device, or built on
  meta and filled from the seed or read from a safetensors folder of several files: the logits
  and gradients of the unsharded model, each rank holding and reading its share only;
- the trainer at tensor 2 × data 2, started from a safetensors folder: a worker SIGKILLed
  mid-way → torchrun restarts the group → the run ends bit for bit like an uninterrupted one;
- its step-10 checkpoint resumes at tensor 1 × data 2 (FSDP2) and in one process (no
  parallelism at all), and that tensor-1 run's step-15 checkpoint at tensor 2 × data 2 again:
  the same samples, the losses of the tensor-parallel run to rounding;
- the tensor × FSDP2 and the FSDP2 checkpoints exported as Hugging Face folders that
  transformers loads to the checkpoints' logits.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from test_export import assert_exports_to_transformers
from trainer_harness import (
    Torchrun,
    assert_bitwise_equal,
    checkpoint_tensors,
    logged_losses,
    read_progress,
    spec_args,
    wait_for,
    worker_env,
)

from torchkube.api.contract import ExitCode
from torchkube.trainer import RunEnv, load_config, run
from torchkube.trainer.llama import PRESETS, Llama
from torchkube.trainer.weights import save_pretrained

pytestmark = pytest.mark.slow

STEPS = 20
START_TIMEOUT = 180  # torch imports take long on a busy 2-core machine
LOSS_TOLERANCE = 2e-4  # the progress line prints 4 decimals; sums in another order differ ~1e-7
WORKER = Path(__file__).with_name("tensor_parallel_worker.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small random Llama in the Hugging Face layout (vocabulary 320 ≥ the data's 257)."""
    folder = tmp_path_factory.mktemp("weights") / "llama"
    torch.manual_seed(7)
    save_pretrained(Llama(replace(PRESETS["llama-tiny"], vocab_size=320)), folder)
    return folder


def recipe(data: Path, weights: Path, tensor: int, **overrides: object) -> list[str]:
    job = {
        "model": "llama-tiny",
        "strategy": "fsdp",
        "weightsPath": str(weights),
        "parallelism.tensor": tensor,
        "activationCheckpointing": "selective",
        "steps": STEPS,
        "logIntervalSteps": 1,
        **overrides,
    }
    return [*spec_args(data, **job), "--checkpoint-interval-steps=5"]


@pytest.fixture(scope="module")
def reference(
    token_data: Path, weights: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, str]:
    """An uninterrupted run at tensor 2 × data 2: its checkpoints and its log."""
    folder = tmp_path_factory.mktemp("tensor-reference")
    runner = Torchrun(folder)
    try:
        launch = runner.start(4, recipe(token_data, weights, 2), checkpoint_dir=folder / "ckpt")
        assert launch.wait(START_TIMEOUT + 120) == 0, launch.output()[-4000:]
    finally:
        runner.close()
    record = read_progress(folder / "ckpt")
    assert record["finished"] and record["step"] == STEPS and record["worldSize"] == 4
    return folder / "ckpt", launch.output()


def test_tensor_parallel_model_computes_the_unsharded_models_numbers(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=4",
            str(WORKER),
            str(tmp_path / "weights"),
        ],
        env=worker_env(PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT + 60,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(records) == 9
    assert len(list((tmp_path / "weights").glob("model-*-of-*.safetensors"))) > 1
    for r in records:
        assert r["logits"] < 1e-5 and r["grads"] < 1e-6, r
        assert r["tied"], r  # the head is the embedding again after the split
        # a q_proj weight is split over tensor × data ranks, or over tensor ranks only (DDP)
        assert r["local_fraction"] == (0.5 if r["strategy"] == "ddp" else 0.25), r
        if r["source"] == "safetensors":  # each rank reads its share, and a little more
            assert r["local_fraction"] <= r["read_fraction"] < r["local_fraction"] + 0.01, r


def test_killed_worker_resumes_bitwise(
    reference: tuple[Path, str],
    token_data: Path,
    weights: Path,
    tmp_path: Path,
    torchrun: Torchrun,
) -> None:
    ref_ckpt, ref_log = reference
    assert "started from the weights in" in ref_log
    assert "strategy fsdp × tensor 2" in ref_log and "world 4 (data 2 × tensor 2)" in ref_log
    losses = logged_losses(ref_log)
    assert losses[STEPS] < losses[1] - 0.5  # it learns

    ckpt = tmp_path / "ckpt"
    launch = torchrun.start(4, recipe(token_data, weights, 2), checkpoint_dir=ckpt, max_restarts=1)

    def trained_past_a_checkpoint() -> bool:
        record = read_progress(ckpt)
        return record.get("step", 0) >= 12 and (record.get("lastCheckpointStep") or 0) >= 10

    wait_for(trained_past_a_checkpoint, START_TIMEOUT, "step 12", [launch])
    os.kill(launch.workers()[1], signal.SIGKILL)
    assert launch.wait(START_TIMEOUT + 120) == 0, launch.output()[-4000:]
    record = read_progress(ckpt)
    assert "resumed from" in launch.output() and record["resumes"] == 1
    assert record["loss"] == read_progress(ref_ckpt)["loss"]
    assert_bitwise_equal(
        checkpoint_tensors(ckpt / f"step-{STEPS}"), checkpoint_tensors(ref_ckpt / f"step-{STEPS}")
    )


def assert_same_losses(ours: dict[int, float], theirs: dict[int, float], first: int) -> None:
    assert sorted(ours) == list(range(first, STEPS + 1))
    for step, loss in ours.items():
        assert loss == pytest.approx(theirs[step], abs=LOSS_TOLERANCE), f"step {step}"


def test_a_tensor_parallel_checkpoint_exports_to_what_transformers_computes(
    reference: tuple[Path, str], tmp_path: Path
) -> None:
    """Each tensor reassembled from its tensor × data shards, one at a time."""
    ref_ckpt, _ = reference
    assert_exports_to_transformers(
        ref_ckpt / f"step-{STEPS}", tmp_path / "hf", max_file_bytes=10**5
    )
    assert len(list((tmp_path / "hf").glob("model-*-of-*.safetensors"))) > 1


def test_checkpoint_reshards_across_tensor_and_data_sizes(
    reference: tuple[Path, str],
    token_data: Path,
    weights: Path,
    tmp_path: Path,
    torchrun: Torchrun,
    trainer_log: pytest.LogCaptureFixture,
) -> None:
    ref_ckpt, ref_log = reference
    expected = logged_losses(ref_log)

    # tensor 1 × data 2: FSDP2 alone, the same two data ranks
    two = tmp_path / "two"
    shutil.copytree(ref_ckpt / "step-10", two / "step-10")
    launch = torchrun.start(2, recipe(token_data, weights, 1), checkpoint_dir=two, name="two")
    assert launch.wait(START_TIMEOUT + 120) == 0, launch.output()[-4000:]
    assert "step-10 (written at world size 4 with fsdp × tensor 2)" in launch.output()
    assert_same_losses(logged_losses(launch.output()), expected, first=11)
    # an FSDP2 checkpoint taken away (test_export.py)
    assert_exports_to_transformers(two / f"step-{STEPS}", tmp_path / "hf-fsdp")

    # and back: tensor 2 × data 2 from the tensor-1 run's step 15
    back = tmp_path / "back"
    shutil.copytree(two / "step-15", back / "step-15")
    launch = torchrun.start(4, recipe(token_data, weights, 2), checkpoint_dir=back, name="back")
    assert launch.wait(START_TIMEOUT + 120) == 0, launch.output()[-4000:]
    assert "step-15 (written at world size 2 with fsdp)" in launch.output()
    assert_same_losses(logged_losses(launch.output()), expected, first=16)

    # one process, DDP's plain module: data 1
    one = tmp_path / "one"
    shutil.copytree(ref_ckpt / "step-10", one / "step-10")
    spec, _ = load_config(recipe(token_data, weights, 1, strategy="ddp"), {})
    assert run(spec, RunEnv(checkpoint_dir=one, checkpoint_interval_steps=5)) == ExitCode.OK
    text = "\n".join(f"torchkube: {message}" for message in trainer_log.messages)
    assert "world size changed 2 → 1" in text
    assert_same_losses(logged_losses(text), expected, first=11)
    final = checkpoint_tensors(one / f"step-{STEPS}")
    assert final["train.consumed_samples"] == 16 * STEPS
    assert re.search(r"optim\.state\..*\.step", " ".join(final))  # Adam state carried over
