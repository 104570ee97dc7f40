"""What gets trained: the public seam for a user's own model, dataset and loss.

The trainer needs four things from a workload and nothing else: a way to build the model, a
map-style training dataset (``__len__`` + ``__getitem__``), a loss, and — for FSDP and
``compile`` — the repeated blocks to shard or compile one by one. The built-in GPT on a token
file is just one :class:`Workload`; see docs/trainer.md for a custom one.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from torchkube.api.trainer import TrainerSpec
from torchkube.trainer.data import TokenDataset
from torchkube.trainer.model import GPT, PRESETS, GPTConfig, cross_entropy_loss, pad_vocab
from torchkube.trainer.prepare import sample_data_paths
from torchkube.trainer.tokens import read_header, resolve_token_files

Batch = Any  # whatever torch.utils.data.default_collate makes of the dataset's items


def _no_eval(spec: TrainerSpec) -> Dataset | None:
    return None


def _no_blocks(model: nn.Module) -> Sequence[nn.Module]:
    return []


def _unknown_flops(model: nn.Module, spec: TrainerSpec) -> float | None:
    return None


@dataclass
class Workload:
    """A model, its data and its loss, as plain callables of the spec.

    ``build_model`` runs under ``torch.device(<the process's device>)`` after the seed is set,
    so every rank builds identical weights. ``loss_fn(model, batch)`` returns the mean loss
    of one micro-batch; ``batch`` is the collated dataset items, already on the device.
    ``flops_per_token`` enables the MFU metric; ``blocks`` are sharded (FSDP) or compiled
    individually, the rest of the model with the root.
    """

    build_model: Callable[[TrainerSpec], nn.Module]
    train_dataset: Callable[[TrainerSpec], Dataset]
    loss_fn: Callable[[nn.Module, Batch], torch.Tensor]
    eval_dataset: Callable[[TrainerSpec], Dataset | None] = _no_eval
    blocks: Callable[[nn.Module], Sequence[nn.Module]] = _no_blocks
    flops_per_token: Callable[[nn.Module, TrainerSpec], float | None] = _unknown_flops


def data_paths(spec: TrainerSpec) -> tuple[str, str | None]:
    """Train and eval token files: the spec's, or the generated sample corpus when unset."""
    if spec.data_path:
        return spec.data_path, spec.eval_data_path
    train, val = sample_data_paths()
    return train, spec.eval_data_path or val


def gpt_config(spec: TrainerSpec) -> GPTConfig:
    """The preset's shape, the spec's context length, the data's vocabulary."""
    vocab = spec.vocab_size or max(
        read_header(p).vocab_size for p in resolve_token_files(data_paths(spec)[0])
    )
    return replace(
        PRESETS[spec.model],
        block_size=spec.seq_len,
        vocab_size=pad_vocab(vocab),
        dropout=spec.dropout,
    )


def _gpt_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    x, y = batch
    return cross_entropy_loss(model(x), y)


def _gpt_eval_data(spec: TrainerSpec) -> Dataset | None:
    path = data_paths(spec)[1]
    return TokenDataset(path, spec.seq_len) if path else None


def _gpt_blocks(model: nn.Module) -> Sequence[nn.Module]:
    assert isinstance(model, GPT)
    return list(model.h)


def _gpt_flops(model: nn.Module, spec: TrainerSpec) -> float:
    assert isinstance(model, GPT)
    return model.flops_per_token(spec.seq_len)


def gpt_workload() -> Workload:
    """The built-in workload: a GPT preset on a memory-mapped token file."""
    return Workload(
        build_model=lambda spec: GPT(gpt_config(spec)),
        train_dataset=lambda spec: TokenDataset(data_paths(spec)[0], spec.seq_len),
        loss_fn=_gpt_loss,
        eval_dataset=_gpt_eval_data,
        blocks=_gpt_blocks,
        flops_per_token=_gpt_flops,
    )
