"""What gets trained: the public seam for a user's own model, dataset and loss.

The trainer needs four things from a workload and nothing else: a way to build the model, a
map-style training dataset (``__len__`` + ``__getitem__``), a loss, and — for FSDP, activation
checkpointing and ``compile`` — the repeated blocks to shard, recompute or compile one by one.
Tensor parallelism needs the model's plan, and starting from published weights a loader. The
built-in GPT and Llama-family models on a token file are just :class:`Workload` s; see
docs/trainer.md for a custom one.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset

from torchkube.api.trainer import TrainerSpec, is_llama_family
from torchkube.trainer import hf
from torchkube.trainer.data import TokenDataset
from torchkube.trainer.llama import PRESETS as LLAMA_PRESETS
from torchkube.trainer.llama import Llama, LlamaConfig, tensor_parallel_plan
from torchkube.trainer.model import GPT, PRESETS, GPTConfig, cross_entropy_loss, pad_vocab
from torchkube.trainer.parallel import TensorPlan
from torchkube.trainer.prepare import sample_data_paths
from torchkube.trainer.tokens import read_header, resolve_token_files
from torchkube.trainer.weights import init_sharded, llama_hf_config, load_pretrained

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
    ``flops_per_token`` enables the MFU metric; ``blocks`` are sharded (FSDP), recomputed
    (activation checkpointing) or compiled individually, the rest of the model with the root.

    ``tensor_plan(model, tensor)`` says how to split the model's modules over ``tensor``
    ranks (``parallel.TensorPlan``; ValueError when the model's shape does not divide).

    Starting weights, when a run begins without a checkpoint: ``load_weights(model, spec,
    group)`` reads published ones into the parallelised model; ``init_weights(model, seed)``
    draws random ones, each parameter a function of the seed and its name, as
    ``build_model`` does. With either, a model that will be sharded (FSDP2, HSDP, tensor
    parallelism) is built under the meta device and materialised, uninitialised, after
    parallelisation, so that no rank ever holds all of it.

    ``hf_config(model, spec)``, the model's Hugging Face ``config.json``, is recorded with
    every checkpoint so that any of them can be exported in that format (``export.py``).
    """

    build_model: Callable[[TrainerSpec], nn.Module]
    train_dataset: Callable[[TrainerSpec], Dataset]
    loss_fn: Callable[[nn.Module, Batch], torch.Tensor]
    eval_dataset: Callable[[TrainerSpec], Dataset | None] = _no_eval
    blocks: Callable[[nn.Module], Sequence[nn.Module]] = _no_blocks
    flops_per_token: Callable[[nn.Module, TrainerSpec], float | None] = _unknown_flops
    tensor_plan: TensorPlan | None = None
    load_weights: Callable[[nn.Module, TrainerSpec, dist.ProcessGroup], None] | None = None
    init_weights: Callable[[nn.Module, int], None] | None = None
    hf_config: Callable[[nn.Module, TrainerSpec], dict[str, Any]] | None = None


def data_paths(spec: TrainerSpec) -> tuple[str, str | None]:
    """Train and eval token files: the spec's, or the generated sample corpus when unset."""
    if spec.data_path:
        return spec.data_path, spec.eval_data_path
    train, val = sample_data_paths()
    return train, spec.eval_data_path or val


def data_vocab_size(spec: TrainerSpec) -> int:
    """The vocabulary the spec sets, else the largest the training data's headers record."""
    return spec.vocab_size or max(
        read_header(p).vocab_size for p in resolve_token_files(data_paths(spec)[0])
    )


def gpt_config(spec: TrainerSpec) -> GPTConfig:
    """The preset's shape, the spec's context length, the data's vocabulary."""
    vocab = data_vocab_size(spec)
    return replace(
        PRESETS[spec.model],
        block_size=spec.seq_len,
        vocab_size=pad_vocab(vocab),
        dropout=spec.dropout,
    )


def _next_token_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    x, y = batch
    return cross_entropy_loss(model(x), y)


_compiled_cross_entropy = torch.compile(cross_entropy_loss)
"""The logits of a 50k–128k vocabulary are the largest tensor of a step: eager, the loss writes
an fp32 copy of them and reads it back in forward and backward; compiled, it is one fused pass
over the bf16 logits each way (nanoGPT computes its loss inside its compiled model)."""


def _compiled_next_token_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    x, y = batch
    return _compiled_cross_entropy(model(x), y)


def next_token_loss(compile: bool) -> Callable[[nn.Module, Batch], torch.Tensor]:
    """The built-in models' loss, compiled when the model is (``spec.compile``)."""
    return _compiled_next_token_loss if compile else _next_token_loss


def _train_tokens(spec: TrainerSpec) -> Dataset:
    return TokenDataset(data_paths(spec)[0], spec.seq_len)


def _eval_tokens(spec: TrainerSpec) -> Dataset | None:
    path = data_paths(spec)[1]
    return TokenDataset(path, spec.seq_len) if path else None


def _gpt_blocks(model: nn.Module) -> Sequence[nn.Module]:
    assert isinstance(model, GPT)
    return list(model.h)


def _gpt_flops(model: nn.Module, spec: TrainerSpec) -> float:
    assert isinstance(model, GPT)
    return model.flops_per_token(spec.seq_len)


def gpt_workload(compile: bool = False) -> Workload:
    """The built-in workload: a GPT preset on a memory-mapped token file."""
    return Workload(
        build_model=lambda spec: GPT(gpt_config(spec)),
        train_dataset=_train_tokens,
        loss_fn=next_token_loss(compile),
        eval_dataset=_eval_tokens,
        blocks=_gpt_blocks,
        flops_per_token=_gpt_flops,
    )


def llama_config(spec: TrainerSpec) -> LlamaConfig:
    """The weights folder's config.json, as it is; else the preset's shape with the spec's
    context length and the data's vocabulary."""
    if spec.weights_path:
        return LlamaConfig(**hf.llama_fields(hf.read_config(Path(spec.weights_path))))
    return replace(
        LLAMA_PRESETS[spec.model],
        max_seq_len=spec.seq_len,
        vocab_size=pad_vocab(data_vocab_size(spec)),
    )


def _llama(model: nn.Module) -> Llama:
    assert isinstance(model, Llama)
    return model


def _load_llama_weights(model: nn.Module, spec: TrainerSpec, group: dist.ProcessGroup) -> None:
    assert spec.weights_path is not None
    load_pretrained(model, Path(spec.weights_path), group)  # logs what it read


def _llama_hf_config(model: nn.Module, spec: TrainerSpec) -> dict[str, Any]:
    """The model's config.json, with the token ids of weightsPath's (an export of a model
    brought from there keeps its tokenizer's special tokens)."""
    published = hf.read_config(Path(spec.weights_path)) if spec.weights_path else {}
    token_ids = {key: published[key] for key in hf.TOKEN_ID_KEYS if key in published}
    return {**token_ids, **llama_hf_config(_llama(model).config)}


def llama_workload(from_weights: bool = False, compile: bool = False) -> Workload:
    """A Llama-family preset on a memory-mapped token file; with ``from_weights``, starting
    from the Hugging Face-format folder at ``spec.weightsPath``."""
    return Workload(
        build_model=lambda spec: Llama(llama_config(spec)),
        train_dataset=_train_tokens,
        loss_fn=next_token_loss(compile),
        eval_dataset=_eval_tokens,
        blocks=lambda model: list(_llama(model).layers),
        flops_per_token=lambda model, spec: _llama(model).flops_per_token(spec.seq_len),
        tensor_plan=lambda model, tensor: tensor_parallel_plan(_llama(model).config, tensor),
        load_weights=_load_llama_weights if from_weights else None,
        init_weights=lambda model, seed: init_sharded(model, _llama(model).initial_value, seed),
        hf_config=_llama_hf_config,
    )


def builtin_workload(spec: TrainerSpec) -> Workload:
    """The workload ``spec.model`` names."""
    if is_llama_family(spec.model):
        return llama_workload(from_weights=spec.weights_path is not None, compile=spec.compile)
    return gpt_workload(compile=spec.compile)
