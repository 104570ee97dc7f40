"""Starting weights for a parallelised model — from a Hugging Face-format folder, or from the
seed — filled in shard by shard, so that no rank ever holds the whole model.

From a folder, ``torch.distributed.checkpoint`` (DCP) does the resharding: its load planner
asks each rank for exactly the slices its shards hold — whatever the placements, FSDP2 over
tensor parallelism included — and :class:`SafetensorsReader`, a DCP storage reader, serves
those slices from the memory-mapped safetensors files, file by file. So no rank ever holds the
whole model, nor even a whole tensor it does not keep: a rank of a 2 × 2 (data × tensor) mesh
reads a quarter of every matrix. Each slice is converted to the parameter's dtype as it is
copied (bf16 files into fp32 master weights).

Names: ours are Hugging Face's without their ``model.`` prefix (``llama.py``); a checkpoint
that ties the output head to the embedding may leave ``lm_head.weight`` out.

From the seed (:func:`init_sharded`), each parameter's full initial value is made on every
rank, one parameter at a time, and each rank keeps its part: the weights of the unsharded
model with the same seed, whatever the mesh.
"""

import json
import logging
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from torch.distributed.checkpoint.storage import StorageReader
from torch.distributed.tensor import DTensor
from torch.futures import Future

from torchkube.trainer import hf
from torchkube.trainer.llama import Llama, LlamaConfig
from torchkube.trainer.safetensors import DTYPES, MappedFile, TensorSpec, write_streamed
from torchkube.trainer.state_dicts import param_names

log = logging.getLogger("torchkube.trainer")

HF_PREFIX = "model."  # Hugging Face's prefix of every name but the output head's
HEAD = "lm_head.weight"
MAX_FILE_BYTES = 5 * 2**30  # transformers' default shard size


def hf_name(fqn: str) -> str:
    """Our parameter name as Hugging Face writes it."""
    return fqn if fqn.startswith("lm_head.") else HF_PREFIX + fqn


class SafetensorsReader(StorageReader):
    """A DCP storage reader over a folder of safetensors files (one chunk per tensor)."""

    def __init__(self, folder: Path):
        super().__init__()
        self.folder = folder
        self.entries = hf.tensor_entries(folder)
        self.bytes_read = 0  # what this rank copied out of the files

    def reset(self, checkpoint_id: Any = None) -> None:
        pass

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        return Metadata(
            state_dict_metadata={
                name: TensorStorageMetadata(
                    properties=TensorProperties(dtype=DTYPES[entry.dtype]),
                    size=torch.Size(entry.shape),
                    chunks=[
                        ChunkStorageMetadata(
                            offsets=torch.Size([0] * len(entry.shape)),
                            sizes=torch.Size(entry.shape),
                        )
                    ],
                )
                for name, entry in self.entries.items()
            }
        )

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool) -> None:
        pass

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Copy each requested slice out of its file, one file at a time."""
        by_file: dict[Path, list[Any]] = {}
        for item in plan.items:
            by_file.setdefault(self.entries[item.storage_index.fqn].file, []).append(item)
        for path, items in sorted(by_file.items()):
            mapped = MappedFile(path)
            for item in items:
                source = mapped.tensor(self.entries[item.storage_index.fqn])
                for dim, (start, length) in enumerate(
                    zip(item.storage_offsets, item.lengths, strict=True)
                ):
                    source = source.narrow(dim, start, length)
                target = planner.resolve_tensor(item).detach()
                target.copy_(source)
                self.bytes_read += source.numel() * source.element_size()
                planner.commit_tensor(item, target)
            del mapped
        done: Future[None] = Future()
        done.set_result(None)
        return done

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return Path(checkpoint_id).is_dir()


def load_pretrained(model: nn.Module, folder: Path, group: dist.ProcessGroup) -> int:
    """Fill the (parallelised, materialised) model with the folder's weights, collectively;
    returns the bytes this rank read.

    Every parameter must be in the folder, with its shape (ValueError otherwise); a tied
    output head may be left out. Tensors the model has no use for (a rotary-frequency buffer
    some exporters write) are ignored.
    """
    reader = SafetensorsReader(folder)
    state = get_model_state_dict(model)
    tied_head = HEAD in state and HEAD not in reader.entries and _head_is_tied(model)
    wanted = {hf_name(fqn): cast(torch.Tensor, tensor) for fqn, tensor in state.items()}
    if tied_head:
        del wanted[HEAD]
    missing = sorted(set(wanted) - set(reader.entries))
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        shown = ", ".join(missing[:5]) + more
        raise ValueError(f"{folder} lacks weights for {shown}")
    for name, tensor in wanted.items():
        shape = tuple(tensor.shape)  # a DTensor's is the global shape
        if reader.entries[name].shape != shape:
            raise ValueError(
                f"{name} is {list(reader.entries[name].shape)} in {folder}, the model's is "
                f"{list(shape)}"
            )
    dcp.load(wanted, storage_reader=reader, process_group=group)
    total = sum(entry.end - entry.start for name, entry in reader.entries.items() if name in wanted)
    if dist.get_rank() == 0:
        files = len(hf.weight_files(folder))
        log.info(
            "started from the weights in %s: %d tensors in %d file%s, %.1f%% of their %.1f MiB "
            "read on rank 0",
            folder,
            len(wanted),
            files,
            "" if files == 1 else "s",
            100 * reader.bytes_read / max(total, 1),
            total / 2**20,
        )
    return reader.bytes_read


def init_sharded(
    model: nn.Module,
    initial_value: Callable[[str, torch.Size, int, torch.device], torch.Tensor],
    seed: int,
) -> None:
    """Random starting weights for a model built on meta, parallelised and materialised:
    ``initial_value(name, shape, seed, device)`` of each parameter, made whole on this rank
    one parameter at a time, of which this rank keeps its shard."""
    with torch.no_grad():
        for param, name in param_names(model).items():
            local = param.to_local() if isinstance(param, DTensor) else param
            full = initial_value(name, param.shape, seed, local.device)
            if isinstance(param, DTensor):
                [chunk] = param.__create_chunk_list__()
                for dim, (offset, size) in enumerate(zip(chunk.offsets, chunk.sizes, strict=True)):
                    full = full.narrow(dim, offset, size)
            local.copy_(full)


def _head_is_tied(model: nn.Module) -> bool:
    config = getattr(model, "config", None)
    return bool(getattr(config, "tie_embeddings", False))


def llama_hf_config(config: LlamaConfig) -> dict[str, Any]:
    """The Hugging Face ``config.json`` of a Llama-family model: Mistral's with a sliding
    window, Llama's otherwise."""
    fields = {k: v for k, v in asdict(config).items() if v is not None}
    return hf.hf_config(fields, "mistral" if config.sliding_window else "llama")


def save_pretrained(model: Llama, folder: Path, max_file_bytes: int = MAX_FILE_BYTES) -> None:
    """Write an unsharded model as a Hugging Face folder: ``config.json`` and the weights in
    safetensors files of at most ``max_file_bytes`` each, with their index when there are
    several (the layout ``transformers``' ``save_pretrained`` writes)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / hf.CONFIG_FILE).write_text(json.dumps(llama_hf_config(model.config), indent=2))
    tensors = {hf_name(k): v for k, v in model.state_dict().items()}
    if model.config.tie_embeddings:
        tensors.pop(HEAD)
    specs = [TensorSpec(name, t.dtype, tuple(t.shape)) for name, t in tensors.items()]
    write_weights(folder, specs, tensors.__getitem__, max_file_bytes)


def write_weights(
    folder: Path,
    specs: list[TensorSpec],
    produce: Callable[[str], torch.Tensor],
    max_file_bytes: int = MAX_FILE_BYTES,
) -> list[Path]:
    """The tensors ``specs`` names, in that order, as ``model.safetensors`` or, past
    ``max_file_bytes``, as ``model-0000N-of-0000M.safetensors`` files with their index;
    ``produce(name)`` is asked for each tensor as its bytes are written, one at a time."""
    files: list[list[TensorSpec]] = [[]]
    size = 0
    for spec in specs:
        if files[-1] and size + spec.nbytes > max_file_bytes:
            files.append([])
            size = 0
        files[-1].append(spec)
        size += spec.nbytes
    if len(files) == 1:
        names = [f"model{hf.SUFFIX}"]
    else:
        names = [f"model-{i:05d}-of-{len(files):05d}{hf.SUFFIX}" for i in range(1, len(files) + 1)]
    for name, part in zip(names, files, strict=True):
        write_streamed(folder / name, part, produce)
    if len(files) > 1:
        pairs = zip(names, files, strict=True)
        weight_map = {spec.name: name for name, part in pairs for spec in part}
        total = sum(spec.nbytes for spec in specs)
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (folder / hf.INDEX_FILE).write_text(json.dumps(index, indent=2))
    return [folder / name for name in names]
