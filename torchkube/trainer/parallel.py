"""Parallelisms, each its own ``apply_*`` behind :func:`parallelize` (torchtitan's layout).

The order in :func:`parallelize` is fixed and matters: compile each block first, so FSDP's
hooks wrap the compiled blocks; then shard (FSDP2/HSDP) or replicate (DDP). ZeRO-1 is DDP plus
a sharded optimizer and lives in :func:`build_optimizer`.

A world of one process trains the plain module with a plain AdamW for ``ddp`` and ``zero1``:
DDP's all-reduce and ZeRO's broadcast would only copy memory there. FSDP2 and HSDP stay
FSDP2 at any size, since their mixed-precision policy changes the numbers.
"""

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import cast

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from torchkube.api.trainer import TrainerSpec
from torchkube.trainer.distributed import DistInfo
from torchkube.trainer.loader import ConfigError
from torchkube.trainer.metrics import MatmulPrecision


def compute_dtype(spec: TrainerSpec, device: torch.device) -> torch.dtype:
    """bf16 when asked for, or by default on CUDA; fp32 otherwise."""
    if spec.precision == "bf16" or (spec.precision == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return torch.float32


def matmul_precision(
    spec: TrainerSpec, device: torch.device, float32_matmul_precision: str
) -> MatmulPrecision:
    """The precision the model's matmuls run in, which MFU must be measured against: bf16;
    TF32 for fp32 on CUDA unless ``torch.set_float32_matmul_precision`` is "highest" (as
    with ``deterministic: true``); fp32 otherwise."""
    if compute_dtype(spec, device) == torch.bfloat16:
        return "bf16"
    if device.type == "cuda" and float32_matmul_precision != "highest":
        return "tf32"
    return "fp32"


def build_mesh(spec: TrainerSpec, info: DistInfo) -> DeviceMesh:
    """1-D mesh for FSDP; (replicate × shard) for HSDP, shard groups within a node by default."""
    if spec.strategy == "fsdp":
        return init_device_mesh(info.device.type, (info.world_size,), mesh_dim_names=("shard",))
    shard = spec.hsdp_shard_size or info.local_world_size
    if info.world_size % shard:
        raise ConfigError(f"hsdpShardSize ({shard}) must divide the world size ({info.world_size})")
    return init_device_mesh(
        info.device.type, (info.world_size // shard, shard), mesh_dim_names=("replicate", "shard")
    )


def apply_compile(blocks: Sequence[nn.Module]) -> None:
    """Compile block by block: one graph per block type is reused, and FQNs stay unchanged."""
    for block in blocks:
        block.compile()


def apply_fsdp(
    model: nn.Module, blocks: Sequence[nn.Module], mesh: DeviceMesh, param_dtype: torch.dtype
) -> None:
    """FSDP2: ``fully_shard`` each block, then the root (embeddings, final norm, head).

    Gradients are reduced in fp32 whatever the compute dtype. The last block keeps its
    parameters gathered after forward, since backward needs them straight away.
    """
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for i, block in enumerate(blocks):
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=i < len(blocks) - 1)
    fully_shard(model, mesh=mesh, mp_policy=mp)


def apply_ddp(model: nn.Module, device: torch.device, bucket_size_mb: int) -> DDP:
    """DDP with gradients written straight into the communication buckets (no extra copy)."""
    return DDP(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=bucket_size_mb,
        gradient_as_bucket_view=True,
    )


def parallelize(
    model: nn.Module, spec: TrainerSpec, info: DistInfo, blocks: Sequence[nn.Module]
) -> nn.Module:
    """Apply the configured strategy; returns the module to call in the training loop."""
    if spec.compile:
        apply_compile(blocks)
    if spec.strategy in ("fsdp", "hsdp"):
        apply_fsdp(model, blocks, build_mesh(spec, info), compute_dtype(spec, info.device))
        return model
    if info.world_size == 1:
        return model
    return apply_ddp(model, info.device, spec.ddp_bucket_size_mb)


def autocast(
    spec: TrainerSpec, model: nn.Module, device: torch.device
) -> contextlib.AbstractContextManager:
    """bf16 autocast for DDP/ZeRO-1; FSDP2 casts through its mixed-precision policy instead."""
    dtype = compute_dtype(spec, device)
    if dtype == torch.float32 or isinstance(model, FSDPModule):
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """What a non-final accumulation micro-step (``enabled`` False) may skip.

    DDP skips its all-reduce: the local gradients are no bigger than the model either way.
    FSDP2 reduce-scatters every micro-step, because skipping it would keep a full unsharded
    gradient on every rank until the last micro-step — all of FSDP's gradient-memory saving,
    and more so after an elastic shrink raises the accumulation (torchtitan does the same).
    HSDP skips only the all-reduce across replica groups and adds the reduce-scattered
    shards up until the last micro-step.
    """
    if isinstance(model, DDP):
        with contextlib.nullcontext() if enabled else model.no_sync():
            yield
    elif isinstance(model, FSDPModule):
        model.set_requires_all_reduce(enabled)
        yield
    else:
        yield


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside a DDP wrapper (FSDP2 shards in place, so nothing to unwrap)."""
    return cast(nn.Module, model.module) if isinstance(model, DDP) else model


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: decay on matrices and embeddings, none on biases and norms (nanoGPT)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def _adamw_options(spec: TrainerSpec, device: torch.device) -> dict:
    """AdamW's hyper-parameters from the spec; the fused kernel on CUDA."""
    return {
        "lr": spec.learning_rate,
        "betas": (spec.beta1, spec.beta2),
        "eps": 1e-8,
        "fused": device.type == "cuda",
    }


def apply_zero1(
    groups: list[dict], spec: TrainerSpec, device: torch.device
) -> ZeroRedundancyOptimizer:
    """AdamW inside ZeroRedundancyOptimizer: each parameter's optimizer state lives on one
    rank, which broadcasts the updated parameter. With ``parameters_as_bucket_view`` each
    rank's parameters are views into one flat buffer, so that is one broadcast per rank rather
    than one per tensor."""
    return ZeroRedundancyOptimizer(
        groups,
        optimizer_class=torch.optim.AdamW,
        parameters_as_bucket_view=True,
        **_adamw_options(spec, device),
    )


def build_optimizer(model: nn.Module, spec: TrainerSpec, info: DistInfo) -> torch.optim.Optimizer:
    """AdamW with nanoGPT's two groups; ZeRO-1 (:func:`apply_zero1`) over several processes."""
    groups = param_groups(model, spec.weight_decay)
    if spec.strategy == "zero1" and info.world_size > 1:
        return apply_zero1(groups, spec, info.device)
    return torch.optim.AdamW(groups, **_adamw_options(spec, info.device))


def lr_lambda(spec: TrainerSpec) -> Callable[[int], float]:
    """Learning-rate multiplier at a step: linear warm-up, then cosine or linear decay."""

    def multiplier(step: int) -> float:
        if step < spec.warmup_steps:
            return (step + 1) / (spec.warmup_steps + 1)
        if spec.lr_schedule == "constant":
            return 1.0
        progress = min(1.0, (step - spec.warmup_steps) / max(1, spec.steps - spec.warmup_steps))
        floor = spec.min_learning_rate_ratio
        if spec.lr_schedule == "linear":
            return 1.0 - progress * (1.0 - floor)
        return floor + 0.5 * (1.0 + math.cos(math.pi * progress)) * (1.0 - floor)

    return multiplier
