"""Strategies in one process (world size 1, gloo): what each ``apply_*`` makes of the model,
what gradient accumulation does to FSDP2's gradients, what activation checkpointing recomputes.
Several processes: test_torchrun.py, test_tensor_parallel.py."""

from collections import Counter
from dataclasses import replace

import pytest
import torch
from torch.distributed.fsdp import FSDPModule
from torch.utils._python_dispatch import TorchDispatchMode

from torchkube.api.trainer import TrainerSpec
from torchkube.trainer import parallel
from torchkube.trainer.distributed import DistInfo
from torchkube.trainer.llama import PRESETS as LLAMA_PRESETS
from torchkube.trainer.llama import Llama
from torchkube.trainer.model import GPT, PRESETS, cross_entropy_loss
from torchkube.trainer.parallel import (
    build_optimizer,
    fsdp_units,
    gradient_sync,
    matmul_precision,
    parallelize,
)


def _fsdp_states(model: torch.nn.Module) -> list:
    """FSDP2's state of every module it manages."""
    return [m._get_fsdp_state() for m in model.modules() if isinstance(m, FSDPModule)]


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


def test_a_world_of_one_compiles_its_plain_module_whole_and_fsdp_block_by_block(
    info: DistInfo,
) -> None:
    """No data-parallel hook runs between the blocks of a world of one, so one graph serves
    the whole forward (a GPU's host launches one graph instead of one per block); FSDP2's
    per-unit hooks stay outside the blocks' graphs."""
    for strategy, whole in (("ddp", True), ("fsdp", False)):
        gpt = tiny_gpt()
        spec = TrainerSpec(model="tiny", device="cpu", strategy=strategy, compile=True)
        model = parallelize(gpt, spec, info, list(gpt.h))
        compiled = {name for name, m in model.named_modules() if m._compiled_call_impl}
        assert compiled == ({""} if whole else {f"h.{i}" for i in range(len(gpt.h))})
        assert "h.0.attn.c_attn.weight" in dict(model.named_parameters())  # FQNs unchanged


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


class OpCounter(TorchDispatchMode):
    """Counts the aten ops run while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.counts[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


def backward_ops(mode: str, info: DistInfo) -> tuple[Counter[str], dict[str, torch.Tensor]]:
    """The ops one backward runs with activation checkpointing ``mode``, and the gradients."""
    torch.manual_seed(0)
    llama = Llama(replace(LLAMA_PRESETS["llama-tiny"], vocab_size=64))
    spec = TrainerSpec(model="llama-tiny", device="cpu", activation_checkpointing=mode)  # type: ignore[arg-type]
    model = parallelize(llama, spec, info, list(llama.layers))
    idx = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(1))
    loss = cross_entropy_loss(model(idx[:, :-1]), idx[:, 1:])
    with OpCounter() as counter:
        loss.backward()
    grads = {
        n.replace("_checkpoint_wrapped_module.", ""): p.grad for n, p in model.named_parameters()
    }
    return counter.counts, grads


def test_activation_checkpointing_recomputes_what_its_mode_says(info: DistInfo) -> None:
    """full re-runs each block's forward in backward, matmuls included; selective keeps the
    matmul outputs and re-runs only the cheap ops (here SiLU, once per block). Either way the
    gradients are those computed without it."""
    none, grads = backward_ops("none", info)
    full, full_grads = backward_ops("full", info)
    selective, selective_grads = backward_ops("selective", info)
    layers = LLAMA_PRESETS["llama-tiny"].n_layers
    assert none["silu"] == 0
    assert full["silu"] == selective["silu"] == layers
    assert selective["mm"] == none["mm"] < full["mm"]
    for name, grad in grads.items():
        torch.testing.assert_close(full_grads[name], grad, rtol=0, atol=0)
        torch.testing.assert_close(selective_grads[name], grad, rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_activation_checkpointing_compiles(info: DistInfo, strategy: str) -> None:
    """``compile: true`` with either mode trains, whole (a world of one) or block by block
    (FSDP2), with the gradients of the eager model. torch's compiler refused the no-op
    recomputation context when it was passed explicitly (``full``: NotImplementedError
    inside the first forward)."""
    idx = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(1))
    for mode in ("full", "selective"):
        grads = []
        for compiled in (False, True):
            gpt = tiny_gpt()
            spec = TrainerSpec(
                model="tiny",
                device="cpu",
                strategy=strategy,
                compile=compiled,
                activation_checkpointing=mode,  # type: ignore[arg-type]
            )
            model = parallelize(gpt, spec, info, list(gpt.h))
            cross_entropy_loss(model(idx[:, :-1]), idx[:, 1:]).backward()
            grads.append(
                [
                    p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                    for p in model.parameters()
                ]
            )
        for eager, compiled_grad in zip(*grads, strict=True):
            torch.testing.assert_close(compiled_grad, eager, rtol=1e-4, atol=1e-5)


def test_fsdp_units_hold_enough_parameters_to_keep_the_host_ahead() -> None:
    """Blocks go into consecutive units of about equal length with at least the floor of
    parameters each, while the model has that many; large blocks stay a unit each."""
    blocks = [torch.nn.Linear(10, 10) for _ in range(12)]  # 110 parameters each
    assert fsdp_units(blocks, min_params=10_000) == [blocks]
    assert fsdp_units(blocks, min_params=500) == [blocks[:6], blocks[6:]]
    assert [len(unit) for unit in fsdp_units(blocks, min_params=300)] == [3, 3, 3, 3]
    assert [len(unit) for unit in fsdp_units(blocks[:11], min_params=300)] == [3, 3, 3, 2]
    assert fsdp_units(blocks, min_params=100) == [[block] for block in blocks]


def test_gpt2_small_is_one_fsdp_unit_and_a_1b_llama_one_per_block() -> None:
    """The presets the GPU figures are for, at their real vocabularies."""
    with torch.device("meta"):
        gpt2 = GPT(replace(PRESETS["gpt2"], vocab_size=50304))
        llama = Llama(replace(LLAMA_PRESETS["llama-1b"], vocab_size=128256))
    floor = parallel.FSDP_UNIT_MIN_PARAMS
    assert fsdp_units(list(gpt2.h), floor) == [list(gpt2.h)]
    assert fsdp_units(list(llama.layers), floor) == [[layer] for layer in llama.layers]


@pytest.mark.parametrize(("floor", "units"), [(10**9, 1), (1, PRESETS["tiny"].n_layer)])
def test_fsdp_shards_each_unit_as_one_group(
    info: DistInfo, monkeypatch: pytest.MonkeyPatch, floor: int, units: int
) -> None:
    """One all-gather for all of a small model's blocks, one per block of a large one; both
    train like the plain module."""
    monkeypatch.setattr(parallel, "FSDP_UNIT_MIN_PARAMS", floor)
    spec = TrainerSpec(model="tiny", device="cpu", strategy="fsdp")
    plain, gpt = tiny_gpt(), tiny_gpt()
    model = parallelize(gpt, spec, info, list(gpt.h))
    groups = {id(state._fsdp_param_group) for state in _fsdp_states(model)}
    assert len(groups) == units + 1  # and the root's
    idx = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(1))
    for net in (plain, model):
        cross_entropy_loss(net(idx[:, :-1]), idx[:, 1:]).backward()
    for (name, p), q in zip(plain.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(q.grad.full_tensor(), p.grad, msg=name)
