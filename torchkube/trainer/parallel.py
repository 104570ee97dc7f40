"""Parallelisms, each its own ``apply_*`` behind :func:`parallelize` (torchtitan's layout).

The order in :func:`parallelize` is fixed and matters (torchtitan's):

1. tensor parallelism (:func:`apply_tp`), which must see the model's plain modules to split
   them, inside a pod;
2. activation checkpointing (:func:`apply_ac`), around each (tensor-parallel) block, so the
   recomputation includes the block's tensor-parallel collectives;
3. ``torch.compile`` per block (:func:`apply_compile`), so a compiled graph covers both, and
   the data-parallel hooks between the blocks stay outside the graphs (DDP all-reduces a
   block's gradients while the blocks before it compute theirs); the plain module of a world
   of one has no such hooks and is compiled whole;
4. data parallelism last, over the data dimension of the mesh: shard (FSDP2/HSDP,
   :func:`apply_fsdp`, whose hooks wrap the compiled blocks, in units of several blocks for
   a small model) or replicate (DDP,
   :func:`apply_ddp`; with tensor parallelism, FSDP2 with a shard group of one, since DDP
   cannot replicate DTensors). ZeRO-1 is DDP plus a sharded optimizer and lives in
   :func:`build_optimizer`.

A world of one process trains the plain module with a plain AdamW for ``ddp`` and ``zero1``:
DDP's all-reduce and ZeRO's broadcast would only copy memory there. FSDP2 and HSDP stay
FSDP2 at any size, since their mixed-precision policy changes the numbers.
"""

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any, cast

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from torchkube.api.trainer import ActivationCheckpointing, TrainerSpec
from torchkube.trainer.distributed import DistInfo
from torchkube.trainer.flops import MatmulPrecision
from torchkube.trainer.loader import ConfigError

TensorPlan = Callable[[nn.Module, int], dict[str, ParallelStyle]]
"""A model's tensor-parallel plan for a tensor size: module name (``*`` for any one name
part) → how that module is split."""


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


def build_mesh(spec: TrainerSpec, info: DistInfo) -> DeviceMesh | None:
    """The device mesh; None for DDP and ZeRO-1 without tensor parallelism.

    Without tensor parallelism: 1-D (shard) for FSDP; (replicate × shard) for HSDP, shard
    groups within a node by default. With it, (replicate × shard × tensor), tensor innermost
    so that a tensor group is consecutive ranks — consecutive local ranks of one pod: FSDP
    shards over every data rank (1 × D × T), HSDP within groups of ``hsdpShardSize`` data
    ranks (D/S × S × T), DDP replicates (D × 1 × T).
    """
    tensor, data = info.tensor_size, info.data_size
    if tensor == 1 and spec.strategy in ("ddp", "zero1"):
        return None
    if tensor == 1 and spec.strategy == "fsdp":
        return init_device_mesh(info.device.type, (data,), mesh_dim_names=("shard",))
    shard = {"fsdp": data, "ddp": 1}.get(
        spec.strategy, spec.hsdp_shard_size or info.local_world_size // tensor
    )
    if data % shard:
        size = "world size" if tensor == 1 else "data-parallel size (world over tensor size)"
        raise ConfigError(f"hsdpShardSize ({shard}) must divide the {size} ({data})")
    if tensor == 1:
        return init_device_mesh(
            info.device.type, (data // shard, shard), mesh_dim_names=("replicate", "shard")
        )
    return init_device_mesh(
        info.device.type,
        (data // shard, shard, tensor),
        mesh_dim_names=("replicate", "shard", "tensor"),
    )


def data_mesh(mesh: DeviceMesh, strategy: str) -> DeviceMesh:
    """The dimensions FSDP2 works over: shard alone for FSDP, (replicate, shard) for HSDP and
    for DDP's replication."""
    if mesh.mesh_dim_names == ("shard",):
        return mesh
    if strategy == "fsdp":
        return mesh["shard"]
    return mesh["replicate", "shard"]


def apply_tp(model: nn.Module, mesh: DeviceMesh, plan: dict[str, ParallelStyle]) -> None:
    """Split the model's modules over the tensor dimension as its plan says.

    ``parallelize_module`` turns each parameter into a DTensor one module at a time, which
    unties a parameter two modules share (an output head tied to the embedding): it is tied
    again here, which needs both modules to split it alike.
    """
    tied = _tied_parameter_names(model)
    parallelize_module(model, mesh, plan)
    for first, *others in tied:
        shared = model.get_parameter(first)
        for name in others:
            owner, _, attr = name.rpartition(".")
            module = model.get_submodule(owner)
            placements = getattr(getattr(module, attr), "placements", None)
            if placements != getattr(shared, "placements", None):
                raise ConfigError(
                    f"{first} and {name} share a parameter, but the tensor-parallel plan "
                    "splits them differently"
                )
            setattr(module, attr, shared)


def _tied_parameter_names(model: nn.Module) -> list[list[str]]:
    """Names of each parameter that more than one module holds, in registration order."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return [group for group in names.values() if len(group) > 1]


# Ops whose outputs selective checkpointing keeps: the matmuls, attention and the
# tensor-parallel reduce-scatters — what is expensive to recompute (after torchtitan).
_KEEP_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
}


def _keep_expensive(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _KEEP_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def apply_ac(
    model: nn.Module, blocks: Sequence[nn.Module], mode: ActivationCheckpointing
) -> list[nn.Module]:
    """Activation checkpointing per block; returns the blocks to compile and shard next.

    ``full`` keeps only each block's input and recomputes the whole block in backward (one
    more forward: about a third more compute); ``selective`` keeps the outputs of the ops in
    ``_KEEP_OPS`` and recomputes the cheap rest — norms, activations, rotary embeddings,
    element-wise ops — whose activations take much of the memory at little compute.

    Each block is replaced by a wrapper (``checkpoint_wrapper``, as torchtitan does), so that
    FSDP2's hooks, put on the wrapper next, stay outside the recomputed region (selective
    recomputation replays the region's ops exactly and would meet FSDP's). The wrapper adds
    ``_checkpoint_wrapped_module`` to parameter names; the state dicts leave it out, so
    checkpoints and weights keep the plain names.
    """
    if mode == "none":
        return list(blocks)
    # full passes no context at all: torch's compiler takes checkpoint's own default, but
    # refuses the same no-op function when it is passed (NotImplementedError in the first
    # compiled forward)
    context: dict[str, Any] = (
        {"context_fn": partial(create_selective_checkpoint_contexts, _keep_expensive)}
        if mode == "selective"
        else {}
    )
    parents = {
        id(child): (parent, name)
        for parent in model.modules()
        for name, child in parent.named_children()
    }
    wrapped = []
    for block in blocks:
        parent, name = parents[id(block)]
        wrapper = checkpoint_wrapper(block, **context)
        parent.register_module(name, wrapper)
        wrapped.append(wrapper)
    return wrapped


def apply_compile(modules: Sequence[nn.Module]) -> None:
    """Compile each module in place (``nn.Module.compile``: FQNs stay unchanged); blocks of
    one type share their graph."""
    for module in modules:
        module.compile()


FSDP_UNIT_MIN_PARAMS = 50_000_000
"""The fewest parameters one FSDP2 unit (one all-gather, one reduce-scatter) holds when the
model has that many.

Each unit costs the host a fixed amount of work every step — its pre-forward, pre-backward and
post-backward hooks, the copies in and out of its collectives (a few ms on a current host) —
while its share of the GPU's work grows with its parameters. Units as small as one GPT-2
small block (7M parameters) leave the GPU waiting for the host; a Llama 3.2 1B block (61M)
stays a unit of its own. FSDP1's size-based wrapping policy drew the line by size as well.
docs/benchmarks.md has the measurements."""


def fsdp_units(blocks: Sequence[nn.Module], min_params: int) -> list[list[nn.Module]]:
    """The blocks in consecutive runs of about equal length, each of at least ``min_params``
    parameters where the blocks have that many in all; every block its own unit once they
    are that large. What a unit costs in memory is what it holds gathered: at most about
    ``2 × min_params`` beyond the shards, whatever the model."""
    sizes = [sum(p.numel() for p in block.parameters()) for block in blocks]
    count = max(1, min(len(blocks), sum(sizes) // min_params))
    per_unit, longer = divmod(len(blocks), count)
    units, start = [], 0
    for i in range(count):
        end = start + per_unit + (1 if i < longer else 0)
        units.append(list(blocks[start:end]))
        start = end
    return units


def apply_fsdp(
    model: nn.Module, blocks: Sequence[nn.Module], mesh: DeviceMesh, param_dtype: torch.dtype
) -> None:
    """FSDP2: ``fully_shard`` each unit of blocks (:func:`fsdp_units`), then the root
    (embeddings, final norm, head).

    Gradients are reduced in fp32 whatever the compute dtype. The last unit keeps its
    parameters gathered after forward, since backward needs them straight away.
    """
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    units = fsdp_units(blocks, FSDP_UNIT_MIN_PARAMS)
    for i, unit in enumerate(units):
        fully_shard(
            unit[0] if len(unit) == 1 else unit,
            mesh=mesh,
            mp_policy=mp,
            reshard_after_forward=i < len(units) - 1,
        )
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
    model: nn.Module,
    spec: TrainerSpec,
    info: DistInfo,
    blocks: Sequence[nn.Module],
    tensor_plan: TensorPlan | None = None,
) -> nn.Module:
    """Apply the configured parallelisms in the order of the module docstring; returns the
    module to call in the training loop."""
    mesh = build_mesh(spec, info)
    if info.tensor_size > 1:  # 1. tensor parallelism, inside a pod
        if tensor_plan is None:
            raise ConfigError(
                "parallelism.tensor > 1, but this workload has no tensor-parallel plan"
            )
        assert mesh is not None
        try:
            plan = tensor_plan(model, info.tensor_size)
        except ValueError as e:
            raise ConfigError(str(e)) from e
        apply_tp(model, mesh["tensor"], plan)
    blocks = apply_ac(model, blocks, spec.activation_checkpointing)  # 2. recomputation
    plain = mesh is None and info.world_size == 1
    if spec.compile:  # 3. compile: one graph a step launches fewer than one per block
        apply_compile([model] if plain else blocks)
    # 4. data parallelism
    if mesh is not None:
        apply_fsdp(model, blocks, data_mesh(mesh, spec.strategy), compute_dtype(spec, info.device))
        return model
    if plain:
        return model
    return apply_ddp(model, info.device, spec.ddp_bucket_size_mb)


def shards_parameters(spec: TrainerSpec) -> bool:
    """Whether no rank holds the whole model, so it can be built on the meta device and
    materialised shard by shard (FSDP2, HSDP, tensor parallelism)."""
    return spec.strategy in ("fsdp", "hsdp") or spec.parallelism.tensor > 1


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
