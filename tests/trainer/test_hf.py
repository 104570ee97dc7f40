"""A Hugging Face model folder read without torch: headers, file lists, config.json and the
tokenizer's vocabulary, and what each refuses."""

import json
import struct
from pathlib import Path

import pytest

from torchkube.trainer.hf import (
    hf_config,
    llama_fields,
    read_header,
    tensor_entries,
    tokenizer_vocab_size,
    weight_files,
)

LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "tie_word_embeddings": False,
    "vocab_size": 128256,
    "attention_bias": False,
    "mlp_bias": False,
    "torch_dtype": "bfloat16",
}


def write_file(path: Path, tensors: dict[str, list[int]], data: bytes | None = None) -> None:
    """A safetensors file of F32 tensors with the given shapes (zeros)."""
    header, offset = {}, 0
    for name, shape in tensors.items():
        size = 4
        for dim in shape:
            size *= dim
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + (bytes(offset) if data is None else data))


def test_headers_give_each_tensors_byte_range(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    write_file(path, {"a": [2, 3], "b": [4]})
    entries = read_header(path)
    base = path.stat().st_size - 40
    assert (entries["a"].shape, entries["a"].start, entries["a"].end) == ((2, 3), base, base + 24)
    assert (entries["b"].start, entries["b"].end) == (base + 24, base + 40)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x05\x00", "not a safetensors file"),
        (struct.pack("<Q", 10**9) + b"{}", "not a safetensors file"),
        (struct.pack("<Q", 4) + b"nope", "header is not JSON"),
    ],
)
def test_what_is_not_a_safetensors_file(tmp_path: Path, content: bytes, message: str) -> None:
    (tmp_path / "x.safetensors").write_bytes(content)
    with pytest.raises(ValueError, match=message):
        read_header(tmp_path / "x.safetensors")


def test_truncated_data_is_refused(tmp_path: Path) -> None:
    write_file(tmp_path / "x.safetensors", {"a": [4, 4]}, data=bytes(60))
    with pytest.raises(ValueError, match="tensor a is truncated"):
        read_header(tmp_path / "x.safetensors")


def test_files_come_from_the_index_or_the_folder(tmp_path: Path) -> None:
    write_file(tmp_path / "model-00001-of-00002.safetensors", {"a": [1]})
    write_file(tmp_path / "model-00002-of-00002.safetensors", {"b": [1]})
    write_file(tmp_path / "stray.safetensors", {"c": [1]})
    assert len(weight_files(tmp_path)) == 3
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors"}}
    index["weight_map"]["b"] = "model-00002-of-00002.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert [f.name for f in weight_files(tmp_path)] == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    assert sorted(tensor_entries(tmp_path)) == ["a", "b"]
    index["weight_map"]["c"] = "model-00003-of-00003.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="lists files the folder lacks"):
        weight_files(tmp_path)


def test_a_tensor_in_two_files_is_refused(tmp_path: Path) -> None:
    write_file(tmp_path / "one.safetensors", {"a": [1]})
    write_file(tmp_path / "two.safetensors", {"a": [1]})
    with pytest.raises(ValueError, match="tensor a is in both"):
        tensor_entries(tmp_path)
    with pytest.raises(ValueError, match="holds no"):
        weight_files(tmp_path / "one.safetensors")  # not a folder of weights


def test_llama_and_mistral_configs_map_to_our_fields() -> None:
    fields = llama_fields(LLAMA3_8B)
    assert fields == {
        "vocab_size": 128256,
        "dim": 4096,
        "n_layers": 32,
        "n_heads": 32,
        "n_kv_heads": 8,
        "ffn_dim": 14336,
        "norm_eps": 1e-05,
        "rope_theta": 500000.0,
        "rope_scaling": LLAMA3_8B["rope_scaling"],
        "max_seq_len": 131072,
        "tie_embeddings": False,
    }
    mistral = {**LLAMA3_8B, "model_type": "mistral", "sliding_window": 4096}
    del mistral["rope_scaling"], mistral["num_key_value_heads"]
    fields = llama_fields(mistral)
    assert fields["sliding_window"] == 4096 and fields["n_kv_heads"] == 8  # MistralConfig's
    assert "sliding_window" not in llama_fields({**LLAMA3_8B, "sliding_window": 4096})
    back = hf_config(llama_fields(LLAMA3_8B), "llama")
    assert back["rope_parameters"] == {"rope_theta": 500000.0, **LLAMA3_8B["rope_scaling"]}
    assert "rope_scaling" not in back and "rope_theta" not in back  # transformers 5's format
    assert llama_fields(back) == llama_fields(LLAMA3_8B)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "gpt2"}, "model_type 'gpt2' is not one of llama, mistral"),
        ({"hidden_act": "gelu"}, "only silu"),
        ({"attention_bias": True}, "attention_bias: true is not supported"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "'yarn': only default or llama3"),
        ({"hidden_size": None}, "lacks hidden_size"),
    ],
)
def test_configs_the_model_would_compute_differently_are_refused(
    change: dict, message: str
) -> None:
    config = {k: v for k, v in {**LLAMA3_8B, **change}.items() if v is not None}
    with pytest.raises(ValueError, match=message):
        llama_fields(config)


def test_tokenizer_vocabulary_counts_added_tokens(tmp_path: Path) -> None:
    assert tokenizer_vocab_size(tmp_path) is None
    bpe = {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}}, "added_tokens": [{"id": 7}]}
    (tmp_path / "tokenizer.json").write_text(json.dumps(bpe))
    assert tokenizer_vocab_size(tmp_path) == 8
    unigram = {"model": {"type": "Unigram", "vocab": [["a", -1.0], ["b", -2.0], ["c", -3.0]]}}
    (tmp_path / "tokenizer.json").write_text(json.dumps(unigram))
    assert tokenizer_vocab_size(tmp_path) == 3
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ValueError, match="is not a Hugging Face tokenizer"):
        tokenizer_vocab_size(tmp_path)
