"""A Hugging Face model folder, read without torch: ``config.json``, the safetensors files
and their headers, the tokenizer's vocabulary size.

The trainer's pre-flight checks (``loader.py``, no torch) use it to refuse a folder that can
never load before any process group exists; ``weights.py`` reads the tensors it lists.

The safetensors format (https://huggingface.co/docs/safetensors): an unsigned little-endian
64-bit header length, a JSON header mapping each tensor's name to its dtype, shape and
``data_offsets`` (begin and end, in bytes, relative to the end of the header) plus an optional
``__metadata__`` map of strings, then the tensors' raw little-endian bytes in row-major order.
A large model is split over several files, listed by ``model.safetensors.index.json``'s
``weight_map``.
"""

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
SUFFIX = ".safetensors"
TOKENIZER_FILE = "tokenizer.json"
METADATA_KEY = "__metadata__"
HEADER_LENGTH_BYTES = 8
MAX_HEADER_BYTES = 100 * 2**20  # safetensors' own limit; anything larger is not a header

MODEL_TYPES = ("llama", "mistral")
# Hugging Face's config.json key → LlamaConfig field (torchkube.trainer.llama); the rotary
# embedding's keys are read apart (:func:`rope_fields`).
CONFIG_FIELDS = {
    "vocab_size": "vocab_size",
    "hidden_size": "dim",
    "num_hidden_layers": "n_layers",
    "num_attention_heads": "n_heads",
    "num_key_value_heads": "n_kv_heads",
    "head_dim": "head_dim",
    "intermediate_size": "ffn_dim",
    "rms_norm_eps": "norm_eps",
    "max_position_embeddings": "max_seq_len",
    "sliding_window": "sliding_window",
    "tie_word_embeddings": "tie_embeddings",
}
REQUIRED_CONFIG = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")
# What transformers (5.x, LlamaConfig / MistralConfig) takes for a key config.json leaves
# out; they are not ours (llama.py's), and a Mistral's differ from a Llama's. A null
# num_key_value_heads or head_dim is derived from the heads, as transformers does.
DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {
        "intermediate_size": 11008,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "num_key_value_heads": None,
        "tie_word_embeddings": False,
    },
    "mistral": {
        "intermediate_size": 14336,
        "max_position_embeddings": 4096 * 32,
        "rms_norm_eps": 1e-6,
        "num_key_value_heads": 8,
        "tie_word_embeddings": False,
        "sliding_window": 4096,
    },
}
DEFAULT_ROPE_THETA = 10000.0
# Keys the model does not compute with but a tokenizer's user needs, carried from the
# published config.json to an export of the model trained from it.
TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")
ACTIVATIONS = ("silu", "swish")  # one function under two names in transformers
ROPE_TYPES = ("default", "llama3")
LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1}
DTYPE_BYTES |= {"U8": 1, "BOOL": 1}


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lies: its file, dtype, shape and absolute byte range."""

    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


def read_header(path: Path) -> dict[str, TensorEntry]:
    """The tensors of one safetensors file; ValueError when it is not one, or is truncated."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw = f.read(HEADER_LENGTH_BYTES)
            (length,) = struct.unpack("<Q", raw) if len(raw) == HEADER_LENGTH_BYTES else (-1,)
            if not 0 < length <= min(MAX_HEADER_BYTES, size - HEADER_LENGTH_BYTES):
                raise ValueError(f"{path} is not a safetensors file (no valid header length)")
            header = json.loads(f.read(length))
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror or e}") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not a safetensors file (header is not JSON: {e})") from e
    base = HEADER_LENGTH_BYTES + length
    entries = {}
    for name, info in header.items():
        if name == METADATA_KEY:
            continue
        dtype, shape = info.get("dtype"), tuple(info.get("shape", ()))
        begin, end = info.get("data_offsets", (0, -1))
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {dtype}")
        numel = 1
        for dim in shape:
            numel *= dim
        if end - begin != numel * DTYPE_BYTES[dtype] or base + end > size:
            raise ValueError(f"{path}: tensor {name} is truncated or its header is corrupt")
        entries[name] = TensorEntry(path, dtype, shape, base + begin, base + end)
    return entries


def weight_files(folder: Path) -> list[Path]:
    """The folder's safetensors files: those its index names, or else all of them."""
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{index} is not a safetensors index: {e}") from e
        files = [folder / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ValueError(f"{index} lists files the folder lacks: {', '.join(missing)}")
        return files
    files = sorted(folder.glob(f"*{SUFFIX}"))
    if not files:
        raise ValueError(f"{folder} holds no *{SUFFIX} weights")
    return files


def tensor_entries(folder: Path) -> dict[str, TensorEntry]:
    """Every tensor of the folder by name, over all its files."""
    entries: dict[str, TensorEntry] = {}
    for path in weight_files(folder):
        for name, entry in read_header(path).items():
            if name in entries:
                raise ValueError(f"tensor {name} is in both {entries[name].file} and {path}")
            entries[name] = entry
    return entries


def read_config(folder: Path) -> dict[str, Any]:
    """``config.json`` as a dict; ValueError when absent or not JSON."""
    path = folder / CONFIG_FILE
    try:
        config = json.loads(path.read_text())
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror or e}") from e
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not JSON: {e}") from e
    if not isinstance(config, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return config


def llama_fields(config: dict[str, Any]) -> dict[str, Any]:
    """A Llama/Mistral ``config.json`` as LlamaConfig fields, read as transformers reads it
    (its defaults for keys left out, both formats of the rotary embedding's keys); ValueError,
    naming the key, for anything the model in ``llama.py`` would compute differently."""
    model_type = config.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"model_type {model_type!r} is not one of {', '.join(MODEL_TYPES)}")
    missing = [key for key in REQUIRED_CONFIG if config.get(key) is None]
    if missing:
        raise ValueError(f"config.json lacks {', '.join(missing)}")
    act = config.get("hidden_act", "silu")
    if act not in ACTIVATIONS:
        raise ValueError(f"hidden_act {act!r}: only silu (SwiGLU) is supported")
    if model_type == "llama":  # MistralForCausalLM has no biases whatever the flags say
        for flag in ("attention_bias", "mlp_bias"):
            if config.get(flag):
                raise ValueError(f"{flag}: true is not supported (the model has no biases)")
    if config.get("attention_dropout"):
        raise ValueError(
            f"attention_dropout {config['attention_dropout']}: not supported (the model has no "
            "dropout)"
        )
    given = {**DEFAULTS[model_type], **config}
    fields = {ours: given[theirs] for theirs, ours in CONFIG_FIELDS.items() if theirs in given}
    if fields.get("n_kv_heads") is None:
        fields["n_kv_heads"] = config["num_attention_heads"]
    if model_type == "llama":
        fields.pop("sliding_window", None)  # LlamaForCausalLM has none (the key can be there)
    fields |= rope_fields(config, fields["max_seq_len"])
    return {key: value for key, value in fields.items() if value is not None}


def rope_fields(config: dict[str, Any], max_seq_len: int) -> dict[str, Any]:
    """``rope_theta`` and ``rope_scaling`` (LlamaConfig's) from either format: transformers
    5's ``rope_parameters`` or the top-level ``rope_theta`` and ``rope_scaling`` of earlier
    versions. As in transformers, ``rope_scaling`` wins over ``rope_parameters``, a theta
    inside either over the top-level one, and llama3's original context defaults to
    ``max_position_embeddings``."""
    rope = dict(config.get("rope_scaling") or config.get("rope_parameters") or {})
    key = "rope_scaling" if config.get("rope_scaling") else "rope_parameters"
    nested = sorted(name for name, value in rope.items() if isinstance(value, dict))
    if nested:
        raise ValueError(f"{key} per layer type ({', '.join(nested)}): one rotary embedding only")
    rope_type = rope.pop("rope_type", rope.pop("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"{key}.rope_type {rope_type!r}: only {' or '.join(ROPE_TYPES)}")
    factor = rope.pop("partial_rotary_factor", config.get("partial_rotary_factor"))
    if factor not in (None, 1, 1.0):
        raise ValueError(f"partial_rotary_factor {factor}: the model rotates every feature")
    theta = rope.pop("rope_theta", None) or config.get("rope_theta") or DEFAULT_ROPE_THETA
    if rope_type == "default":
        return {"rope_theta": theta, "rope_scaling": None}
    rope.setdefault("original_max_position_embeddings", max_seq_len)
    absent = [name for name in LLAMA3_KEYS if not isinstance(rope.get(name), int | float)]
    if absent:
        raise ValueError(f"{key}: rope_type llama3 needs a number for {', '.join(absent)}")
    scaling = {"rope_type": "llama3", **{name: rope[name] for name in LLAMA3_KEYS}}
    return {"rope_theta": theta, "rope_scaling": scaling}


def hf_config(fields: dict[str, Any], model_type: str) -> dict[str, Any]:
    """LlamaConfig fields as a Hugging Face ``config.json`` in transformers 5's format (the
    inverse of :func:`llama_fields`), every key written so that no default is left to guess:
    for a folder written by ``weights.save_pretrained`` or an export."""
    theirs = {ours: key for key, ours in CONFIG_FIELDS.items()}
    config = {theirs[key]: value for key, value in fields.items() if key in theirs}
    config.setdefault("num_key_value_heads", fields.get("n_heads"))
    config.setdefault("tie_word_embeddings", False)
    if model_type == "mistral":
        config.setdefault("sliding_window", None)  # absent would mean 4096
    rope = {"rope_type": "default", "rope_theta": fields.get("rope_theta", DEFAULT_ROPE_THETA)}
    rope |= fields.get("rope_scaling") or {}
    architecture = "MistralForCausalLM" if model_type == "mistral" else "LlamaForCausalLM"
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "hidden_act": "silu",
        **config,
        "rope_parameters": rope,
    }


def tokenizer_vocab_size(folder: Path) -> int | None:
    """Tokens the folder's ``tokenizer.json`` can produce (its vocabulary and added tokens);
    None when the folder has no tokenizer."""
    path = folder / TOKENIZER_FILE
    if not path.is_file():
        return None
    try:
        tokenizer = json.loads(path.read_text())
        vocab = tokenizer["model"]["vocab"]  # BPE: token → id; Unigram: [piece, score] list
        ids = set(vocab.values()) if isinstance(vocab, dict) else set(range(len(vocab)))
        ids |= {token["id"] for token in tokenizer.get("added_tokens", [])}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{path} is not a Hugging Face tokenizer: {e}") from e
    return max(ids) + 1 if ids else 0
