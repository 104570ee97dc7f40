"""What a checkpoint holds of the model and the optimizer, for every strategy, in one format.

Model and optimizer state are keyed by parameter name (FQN), so DDP, ZeRO-1, FSDP2 and HSDP
write the same checkpoint and any of them loads it at any world size (DCP reshards):

- DDP, FSDP2, HSDP and a single process go through ``torch.distributed.checkpoint.state_dict``
  (``get_state_dict`` / ``set_state_dict``), which knows FSDP2's sharded parameters.
- ZeRO-1 keeps, on each rank, a local AdamW over the parameters that rank owns. Its state is
  written and loaded here by hand, FQN to local parameter index: the DSD helpers cannot load
  a rank whose share of a parameter group is empty, and ZeRO's greedy partition often makes one.

Replicated tensors (DDP's model and optimizer state, ZeRO-1's model) are the same on every
rank, so each rank stages and writes only its share of them (:func:`own_share`) and DCP's
metadata joins the shares: an async checkpoint then holds one share of host memory per rank,
not a whole copy. FSDP2's and HSDP's state is sharded already.
"""

import itertools
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import _CHECKPOINT_PREFIX
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_leaves, tree_map_only

OPTIMIZER_KEY = "optim"  # where the optimizer's state sits in the checkpoint


def param_names(model: nn.Module) -> dict[nn.Parameter, str]:
    """Each parameter's FQN as DSD writes it: the first name of a tied parameter, without the
    DDP and activation-checkpointing wrappers' parts."""
    names: dict[nn.Parameter, str] = {}
    for name, param in model.named_parameters():
        names.setdefault(param, name.removeprefix("module.").replace(_CHECKPOINT_PREFIX, ""))
    return names


def _numbered(optimizer: torch.optim.Optimizer) -> list[nn.Parameter]:
    """Parameters in the order ``Optimizer.state_dict`` numbers them."""
    return list(itertools.chain.from_iterable(g["params"] for g in optimizer.param_groups))


def _empty_like(state: dict[str, Any]) -> dict[str, Any]:
    return tree_map_only(torch.Tensor, torch.empty_like, state)


def _is_replicated(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and not isinstance(value, DTensor)


class StateDicts:
    """Save, load and apply the model's and optimizer's state through DSD.

    Loading goes into fresh buffers (:meth:`targets`), which :meth:`checked` turns into what
    :meth:`apply` hands over; only :meth:`apply` changes the live model and optimizer, so a
    checkpoint that does not fit fails before anything was touched.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        self.model, self.optimizer = model, optimizer
        self._groups: list[dict[str, Any]] = []

    def save(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Model and optimizer state, FQN-keyed; the live tensors, not copies."""
        return get_state_dict(self.model, self.optimizer)

    def targets(self, saved: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Empty buffers for ``dcp.load``: the model, and the optimizer's ``state`` entries.

        ``saved`` is the checkpoint's ``state_dict_metadata``. DSD initialises an empty AdamW
        state to learn its shapes; :meth:`discard_targets` undoes that if nothing loads.
        """
        model_sd, optim_sd = self.save()
        self._groups = optim_sd["param_groups"]  # hyper-parameters come from the current spec
        return _empty_like(model_sd), _empty_like(optim_sd["state"])

    def checked(self, optim_state: dict[str, Any]) -> dict[str, Any]:
        """The optimizer state dict :meth:`apply` will load."""
        return {"state": optim_state, "param_groups": self._groups}

    def apply(self, model_sd: dict[str, Any], optim_sd: dict[str, Any]) -> None:
        set_state_dict(
            self.model, self.optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd
        )

    def discard_targets(self) -> None:
        """Forget the optimizer state :meth:`targets` initialised, when no checkpoint loaded."""
        self.optimizer.state.clear()

    def replicated_share(
        self, model_sd: dict[str, Any], optim_sd: dict[str, Any], rank: int, world_size: int
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The part of the state this rank writes: its :func:`own_share` of the replicated
        tensors, with each parameter's optimizer state going where its weight goes."""
        state = optim_sd["state"]
        sizes = [
            (key, tensor_bytes(value) + tensor_bytes(state.get(key, {})))
            for key, value in model_sd.items()
            if _is_replicated(value)
        ]
        mine = own_share(sizes, rank, world_size)
        dropped = {key for key, _ in sizes} - mine
        model_part = {k: v for k, v in model_sd.items() if k not in dropped}
        optim_part = {**optim_sd, "state": {k: v for k, v in state.items() if k not in dropped}}
        return model_part, optim_part


class ZeroStateDicts(StateDicts):
    """ZeRO-1: the model through DSD, each rank's local AdamW by hand."""

    def __init__(self, model: nn.Module, optimizer: ZeroRedundancyOptimizer):
        super().__init__(model, optimizer)
        self.zero = optimizer
        self.names = param_names(model)

    def save(self) -> tuple[dict[str, Any], dict[str, Any]]:
        local = self.zero.optim
        state = {
            self.names[p]: dict(local.state[p]) for p in _numbered(local) if local.state.get(p)
        }
        # Param groups must be the same on every rank (DCP writes one copy): every parameter.
        groups = [
            {
                **{k: v for k, v in g.items() if k != "params"},
                "params": [self.names[p] for p in g["params"]],
            }
            for g in self.zero.param_groups
        ]
        return get_model_state_dict(self.model), {"state": state, "param_groups": groups}

    def targets(self, saved: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The state of this rank's own parameters only, shaped as the checkpoint stored it,
        whichever strategy and world size wrote it."""
        state: dict[str, dict[str, torch.Tensor]] = {}
        for name in (self.names[p] for p in _numbered(self.zero.optim)):
            prefix = f"{OPTIMIZER_KEY}.state.{name}."
            entries = {
                key.removeprefix(prefix): torch.empty(meta.size, dtype=meta.properties.dtype)
                for key, meta in saved.items()
                if key.startswith(prefix) and isinstance(meta, TensorStorageMetadata)
            }
            if entries:
                state[name] = entries
        return _empty_like(get_model_state_dict(self.model)), state

    def checked(self, optim_state: dict[str, Any]) -> dict[str, Any]:
        """The local optimizer's own state dict: parameter indices instead of names."""
        local = self.zero.optim
        index = {self.names[p]: i for i, p in enumerate(_numbered(local))}
        return {
            "state": {index[name]: values for name, values in optim_state.items()},
            "param_groups": local.state_dict()["param_groups"],
        }

    def apply(self, model_sd: dict[str, Any], optim_sd: dict[str, Any]) -> None:
        set_model_state_dict(self.model, model_sd)
        self.zero.optim.load_state_dict(optim_sd)  # casts to each parameter's device and dtype

    def discard_targets(self) -> None:
        """Nothing to undo: :meth:`targets` reads only the checkpoint's metadata."""

    def replicated_share(
        self, model_sd: dict[str, Any], optim_sd: dict[str, Any], rank: int, world_size: int
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The model is replicated; the optimizer state is this rank's own already."""
        sizes = [(k, tensor_bytes(v)) for k, v in model_sd.items() if _is_replicated(v)]
        dropped = {key for key, _ in sizes} - own_share(sizes, rank, world_size)
        return {k: v for k, v in model_sd.items() if k not in dropped}, optim_sd


def state_dicts(model: nn.Module, optimizer: torch.optim.Optimizer) -> StateDicts:
    """The state-dict handling that fits the optimizer."""
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        return ZeroStateDicts(model, optimizer)
    return StateDicts(model, optimizer)


def own_share(keys_and_sizes: Iterable[tuple[str, int]], rank: int, world_size: int) -> set[str]:
    """The keys of replicated state this rank stages and writes: each key goes to one rank,
    largest first to the least-loaded rank (ties: the lowest), so every rank computes the same
    split and the shares differ by at most the largest tensor."""
    loads = [0] * world_size
    mine = set()
    for key, size in sorted(keys_and_sizes, key=lambda item: (-item[1], item[0])):
        owner = min(range(world_size), key=lambda r: (loads[r], r))
        loads[owner] += size
        if owner == rank:
            mine.add(key)
    return mine


def tensor_bytes(state: Any) -> int:
    """Bytes of the local tensors in ``state`` (a DTensor counts its local shard)."""
    total = 0
    for leaf in tree_leaves(state):
        if isinstance(leaf, DTensor):
            leaf = leaf.to_local()
        if isinstance(leaf, torch.Tensor):
            total += leaf.numel() * leaf.element_size()
    return total
