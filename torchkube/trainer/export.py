"""A checkpoint taken away as a Hugging Face folder that ``transformers`` (and vLLM) load.

The checkpoint's ``COMPLETE.json`` records the model's ``config.json`` (``checkpoint.HF_CONFIG``,
written by the Llama-family workload), so the folder needs nothing but the checkpoint: the
config in transformers 5's format, the weights as safetensors files (one, or several with an
index past ``maxFileBytes``), and the tokenizer files when given a folder that has them (the
job's ``weightsPath``).

The weights are read tensor by tensor with ``torch.distributed.checkpoint``, whichever strategy
and mesh wrote them (DCP reassembles a tensor from its shards), and each is written out before
the next is read: one tensor in memory at a time, however large the model. The folder is
built under a temporary name beside ``out`` and renamed into place, so a folder at ``out`` is
always complete.
"""

import json
import logging
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from torchkube.trainer import hf
from torchkube.trainer.checkpoint import HF_CONFIG, MARKER, MODEL, step_folders, validate
from torchkube.trainer.llama import Llama, LlamaConfig
from torchkube.trainer.safetensors import TensorSpec
from torchkube.trainer.weights import HEAD, MAX_FILE_BYTES, hf_name, write_weights

log = logging.getLogger("torchkube.trainer")

# What a Hugging Face tokenizer is made of (transformers' AutoTokenizer reads these).
TOKENIZER_FILES = (
    hf.TOKENIZER_FILE,
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "generation_config.json",
)
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def newest_checkpoint(folder: Path) -> Path:
    """``folder`` itself when it is a committed checkpoint, else its newest ``step-N`` that
    validates; ValueError when there is none."""
    if (folder / MARKER).exists() or (folder / ".metadata").exists():
        return folder
    for _, path in step_folders(folder):
        try:
            validate(path)
        except ValueError as e:
            log.warning("skipping checkpoint %s: %s", path, e)
            continue
        return path
    raise ValueError(f"{folder} is not a checkpoint and holds no committed step-N checkpoint")


def export_hf(
    checkpoint: Path,
    out: Path,
    *,
    dtype: torch.dtype | None = None,
    config: dict[str, Any] | None = None,
    tokenizer: Path | None = None,
    max_file_bytes: int = MAX_FILE_BYTES,
) -> list[Path]:
    """Write ``checkpoint``'s model to the new folder ``out``; returns its weight files.

    ``dtype``: the weights' type in the folder (default: as stored, fp32 master weights).
    ``config``: the model's ``config.json`` for a checkpoint that records none.
    ``tokenizer``: a folder whose tokenizer files are copied along.
    ValueError for a checkpoint that is incomplete, records no config, or whose tensors are
    not the config's model; FileExistsError when ``out`` exists.
    """
    if out.exists():
        raise FileExistsError(f"{out} exists: export into a new folder")
    marker = validate(checkpoint)
    config = config or marker.get(HF_CONFIG)
    if config is None:
        raise ValueError(
            f"{checkpoint} records no model config (a custom workload's, or written by an "
            "older torchkube): pass the config.json the model was built from"
        )
    fields = hf.llama_fields(config)
    stored = _stored_model_tensors(checkpoint)
    names = _checked_names(LlamaConfig(**fields), stored, checkpoint)
    specs = [
        TensorSpec(hf_name(fqn), dtype or stored[fqn].properties.dtype, tuple(stored[fqn].size))
        for fqn in names
    ]
    target = {spec.name: (fqn, spec.dtype) for spec, fqn in zip(specs, names, strict=True)}

    def read(name: str) -> torch.Tensor:
        fqn, wanted = target[name]
        meta = stored[fqn]
        tensor = torch.empty(meta.size, dtype=meta.properties.dtype)
        with warnings.catch_warnings():  # that no process group takes part is the intent
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(
                {MODEL: {fqn: tensor}},
                storage_reader=dcp.FileSystemReader(checkpoint),
                no_dist=True,  # this process alone reads, in a process group or not
            )
        return tensor.to(wanted)

    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        files = write_weights(tmp, specs, read, max_file_bytes)
        token_ids = {key: config[key] for key in hf.TOKEN_ID_KEYS if key in config}
        exported = {**token_ids, **hf.hf_config(fields, config["model_type"])}
        exported["dtype"] = DTYPE_NAMES.get(specs[0].dtype, str(specs[0].dtype))
        (tmp / hf.CONFIG_FILE).write_text(json.dumps(exported, indent=2) + "\n")
        copied = _copy_tokenizer(tokenizer, tmp) if tokenizer is not None else []
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    total = sum(spec.nbytes for spec in specs)
    log.info(
        "exported %s to %s: %d tensors, %.1f MiB in %d file%s%s",
        checkpoint,
        out,
        len(specs),
        total / 2**20,
        len(files),
        "" if len(files) == 1 else "s",
        f", tokenizer ({', '.join(copied)})" if copied else "",
    )
    return [out / f.name for f in files]


def _stored_model_tensors(checkpoint: Path) -> dict[str, TensorStorageMetadata]:
    """The checkpoint's model tensors by parameter name, from DCP's metadata alone."""
    saved = dcp.FileSystemReader(checkpoint).read_metadata().state_dict_metadata
    prefix = f"{MODEL}."
    return {
        key.removeprefix(prefix): meta
        for key, meta in saved.items()
        if key.startswith(prefix) and isinstance(meta, TensorStorageMetadata)
    }


def _checked_names(
    config: LlamaConfig, stored: dict[str, TensorStorageMetadata], checkpoint: Path
) -> list[str]:
    """The parameters the config's model has, in its order, each in the checkpoint with its
    shape (a tied output head is the embedding, left out as transformers leaves it)."""
    with torch.device("meta"):
        model = Llama(config)
    expected = {
        name: tuple(p.shape)
        for name, p in model.named_parameters(remove_duplicate=False)
        if not (config.tie_embeddings and name == HEAD)
    }
    missing = sorted(set(expected) - set(stored))
    if missing:
        raise ValueError(f"{checkpoint} lacks {', '.join(missing[:5])} of its config's model")
    for name, shape in expected.items():
        if tuple(stored[name].size) != shape:
            raise ValueError(
                f"{name} is {list(stored[name].size)} in {checkpoint}, {list(shape)} in its "
                "config's model"
            )
    return list(expected)


def _copy_tokenizer(source: Path, folder: Path) -> list[str]:
    """Copy the tokenizer files ``source`` has; a folder without ``tokenizer.json`` and
    without ``tokenizer.model`` holds no tokenizer, and nothing is copied."""
    present = [name for name in TOKENIZER_FILES if (source / name).is_file()]
    if not {hf.TOKENIZER_FILE, "tokenizer.model"} & set(present):
        return []
    for name in present:
        shutil.copyfile(source / name, folder / name)
    return present
