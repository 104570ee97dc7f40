"""Strategies in one process (world size 1, gloo): what each ``apply_*`` makes of the model, and
what gradient accumulation does to FSDP2's gradients. Several processes: test_torchrun.py."""

from dataclasses import replace

import pytest
import torch
from torch.distributed.fsdp import FSDPModule

from torchkube.api.trainer import TrainerSpec
from torchkube.trainer.distributed import DistInfo
from torchkube.trainer.model import GPT, PRESETS, cross_entropy_loss
from torchkube.trainer.parallel import (
    build_optimizer,
    gradient_sync,
    matmul_precision,
    parallelize,
)


def tiny_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(replace(PRESETS["tiny"], vocab_size=64, block_size=16))


def micro_step(model: torch.nn.Module, last: bool) -> None:
    idx = torch.randint(0, 64, (2, 17))
    with gradient_sync(model, last):
        cross_entropy_loss(model(idx[:, :-1]), idx[:, 1:]).backward()


@pytest.mark.parametrize("strategy", ["ddp", "zero1"])
def test_a_world_of_one_trains_the_plain_module(info: DistInfo, strategy: str) -> None:
    """DDP's all-reduce and ZeRO's broadcast do nothing for one process but copy memory."""
    spec = TrainerSpec(model="tiny", device="cpu", strategy=strategy)
    gpt = tiny_gpt()
    model = parallelize(gpt, spec, info, list(gpt.h))
    assert model is gpt
    assert type(build_optimizer(model, spec, info)) is torch.optim.AdamW


def test_zero1_broadcasts_parameters_as_buckets(info: DistInfo) -> None:
    """parameters_as_bucket_view: each rank's parameters are views into one flat buffer, so
    the updated parameters go out in one broadcast per rank instead of one per tensor."""
    gpt = tiny_gpt()
    spec = TrainerSpec(model="tiny", device="cpu", strategy="zero1")
    from torchkube.trainer.parallel import apply_zero1

    apply_zero1([{"params": list(gpt.parameters())}], spec, info.device)
    assert len({p.untyped_storage().data_ptr() for p in gpt.parameters()}) == 1


def test_fsdp_reduce_scatters_every_micro_step(info: DistInfo) -> None:
    """Gradients are sharded after every micro-step, so no rank ever holds a full unsharded
    gradient of the model across the accumulation (torchtitan does the same)."""
    spec = TrainerSpec(model="tiny", device="cpu", strategy="fsdp")
    gpt = tiny_gpt()
    model = parallelize(gpt, spec, info, list(gpt.h))
    assert isinstance(model, FSDPModule)
    micro_step(model, last=False)
    assert all(p.grad is not None for p in model.parameters())
    micro_step(model, last=True)
    assert all(p.grad is not None for p in model.parameters())


def test_hsdp_skips_only_the_all_reduce_across_replicas(
    info: DistInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HSDP reduce-scatters every micro-step too (FSDP2 adds the shards up in a buffer of the
    shard's size) and all-reduces across replica groups on the last one only."""
    calls: list[tuple[str, bool]] = []
    for name in ("set_requires_gradient_sync", "set_requires_all_reduce"):
        original = getattr(FSDPModule, name)

        def record(self: FSDPModule, flag: bool, *a: object, _n: str = name, _o=original, **k):
            calls.append((_n, flag))
            return _o(self, flag, *a, **k)

        monkeypatch.setattr(FSDPModule, name, record)
    spec = TrainerSpec(model="tiny", device="cpu", strategy="hsdp", hsdp_shard_size=1)
    gpt = tiny_gpt()
    model = parallelize(gpt, spec, info, list(gpt.h))
    micro_step(model, last=False)
    micro_step(model, last=True)
    assert calls == [("set_requires_all_reduce", False), ("set_requires_all_reduce", True)]


@pytest.mark.parametrize(
    ("precision", "device", "fp32_setting", "expected"),
    [
        ("bf16", "cuda", "high", "bf16"),
        ("auto", "cuda", "high", "bf16"),
        ("fp32", "cuda", "high", "tf32"),  # torch.set_float32_matmul_precision("high"): TF32
        ("fp32", "cuda", "highest", "fp32"),  # deterministic: true keeps true fp32 matmuls
        ("auto", "cpu", "high", "fp32"),
    ],
)
def test_mfu_counts_against_the_precision_the_matmuls_run_in(
    precision: str, device: str, fp32_setting: str, expected: str
) -> None:
    spec = TrainerSpec(precision=precision)  # type: ignore[arg-type]
    assert matmul_precision(spec, torch.device(device), fp32_setting) == expected
