"""Published weights computed as their publishers compute them: tiny random Llama and Mistral
models built and saved by Hugging Face ``transformers`` (the oracle), loaded through the
trainer's ``weightsPath`` path, give transformers' logits and loss on the same tokens.

Each folder is written by ``save_pretrained`` — one file or sharded with an index, fp32 or
bf16 — and its config.json in transformers 5's format (``rope_parameters``), in the top-level
``rope_theta`` / ``rope_scaling`` format older versions wrote, or with keys left out. The
reference is always ``AutoModelForCausalLM.from_pretrained`` of the same folder, so an edited
config.json is read by transformers itself. What the model cannot reproduce is refused, with
the key named.
"""

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from trainer_harness import relative_error

from torchkube.api.trainer import TrainerSpec
from torchkube.trainer.distributed import DistInfo
from torchkube.trainer.hf import INDEX_FILE, llama_fields, read_config
from torchkube.trainer.model import cross_entropy_loss
from torchkube.trainer.workload import builtin_workload

VOCAB = 96
TOKENS = 48
SHAPE = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
TOLERANCE = 1e-4
"""Both models compute in fp32 (the trainer keeps fp32 weights, bf16 files included): a
misread config shows at 1e-3 and more, rounding at 1e-6."""


def save_hf(
    folder: Path,
    architecture: type,
    dtype: torch.dtype = torch.float32,
    max_shard_size: str | None = None,
    edit: Callable[[dict[str, Any]], None] | None = None,
    **config: Any,
) -> Path:
    """A random model made and saved by transformers; ``edit`` then rewrites its config.json."""
    torch.manual_seed(0)
    config_class = architecture.config_class  # type: ignore[attr-defined]
    model = architecture(config_class(**{**SHAPE, **config}))
    with torch.no_grad():  # norms away from ones, so that their eps and scale both count
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.to(dtype).save_pretrained(folder, **kwargs)
    if edit is not None:
        path = folder / "config.json"
        saved = json.loads(path.read_text())
        edit(saved)
        path.write_text(json.dumps(saved))
    return folder


def assert_same_model(folder: Path, info: DistInfo) -> None:
    """Logits and next-token loss of the folder through weightsPath against transformers'
    model of the folder, both in fp32 whatever dtype the files hold."""
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    model_type = read_config(folder)["model_type"]
    spec = TrainerSpec(model=f"{model_type}-tiny", weights_path=str(folder), device="cpu")
    workload = builtin_workload(spec)
    assert workload.load_weights is not None
    ours = workload.build_model(spec)
    workload.load_weights(ours, spec, info.checkpoint_group)
    ours.eval()
    tokens = torch.randint(VOCAB, (2, TOKENS), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = theirs(tokens, labels=tokens)
        logits = ours(tokens)
        loss = cross_entropy_loss(ours(tokens[:, :-1]), tokens[:, 1:])
    logits_error = relative_error(logits, expected.logits)
    loss_error = relative_error(loss, expected.loss)
    assert logits_error < TOLERANCE, f"logits differ from transformers' by {logits_error:.1e}"
    assert loss_error < TOLERANCE, f"loss differs from transformers' by {loss_error:.1e}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_llama3_rope_scaling_in_rope_parameters(
    tmp_path: Path, info: DistInfo, dtype: torch.dtype
) -> None:
    folder = save_hf(
        tmp_path,
        transformers.LlamaForCausalLM,
        dtype,
        rope_parameters=dict(LLAMA3_ROPE),
        max_position_embeddings=256,
    )
    saved = read_config(folder)
    assert saved["rope_parameters"]["rope_type"] == "llama3" and "rope_scaling" not in saved
    assert_same_model(folder, info)


def to_top_level_keys(config: dict[str, Any]) -> None:
    """config.json as transformers 4 wrote it: rope_theta and rope_scaling at the top."""
    rope = config.pop("rope_parameters")
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = rope if rope["rope_type"] != "default" else None


def test_llama3_rope_scaling_in_top_level_keys(tmp_path: Path, info: DistInfo) -> None:
    folder = save_hf(
        tmp_path,
        transformers.LlamaForCausalLM,
        rope_parameters=dict(LLAMA3_ROPE),
        max_position_embeddings=256,
        edit=to_top_level_keys,
    )
    assert read_config(folder)["rope_scaling"]["factor"] == 8.0
    assert_same_model(folder, info)


def test_tied_llama_sharded_with_an_index(tmp_path: Path, info: DistInfo) -> None:
    folder = save_hf(
        tmp_path,
        transformers.LlamaForCausalLM,
        max_shard_size="40KB",
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        edit=to_top_level_keys,
    )
    assert (folder / INDEX_FILE).is_file() and len(list(folder.glob("*.safetensors"))) > 2
    assert_same_model(folder, info)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_untied_llama_sharded_with_an_index(
    tmp_path: Path, info: DistInfo, dtype: torch.dtype
) -> None:
    folder = save_hf(
        tmp_path,
        transformers.LlamaForCausalLM,
        dtype,
        max_shard_size="40KB",
        rope_parameters=dict(LLAMA3_ROPE),
        max_position_embeddings=256,
    )
    assert (folder / INDEX_FILE).is_file()
    assert_same_model(folder, info)


LEFT_OUT = (
    "rms_norm_eps",
    "num_key_value_heads",
    "head_dim",
    "rope_parameters",
    "max_position_embeddings",
    "tie_word_embeddings",
    "hidden_act",
)


def leave_out(config: dict[str, Any]) -> None:
    for key in LEFT_OUT:
        config.pop(key, None)


@pytest.mark.parametrize(
    ("architecture", "heads"),
    [(transformers.LlamaForCausalLM, 4), (transformers.MistralForCausalLM, 16)],
)
def test_keys_left_out_take_transformers_defaults(
    tmp_path: Path, info: DistInfo, architecture: type, heads: int
) -> None:
    """Defaults differ by family: a Llama without num_key_value_heads has one per query
    head, a Mistral 8 (here against 16 query heads, so neither passes for the other); both
    norms' eps are 1e-6."""
    folder = save_hf(
        tmp_path,
        architecture,
        num_attention_heads=heads,
        num_key_value_heads=heads if architecture is transformers.LlamaForCausalLM else 8,
        sliding_window=None,
        edit=leave_out,
    )
    assert not set(LEFT_OUT) & set(read_config(folder))
    assert_same_model(folder, info)


def test_a_mistral_missing_its_window_has_transformers_4096() -> None:
    config = {**SHAPE, "model_type": "mistral"}
    assert llama_fields(config)["sliding_window"] == 4096
    assert "sliding_window" not in llama_fields({**config, "sliding_window": None})
    assert "sliding_window" not in llama_fields({**config, "model_type": "llama"})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mistral_sliding_window(tmp_path: Path, info: DistInfo, dtype: torch.dtype) -> None:
    folder = save_hf(
        tmp_path,
        transformers.MistralForCausalLM,
        dtype,
        max_shard_size="40KB" if dtype == torch.float32 else None,
        sliding_window=16,
        rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
    )
    assert read_config(folder)["sliding_window"] == 16
    assert_same_model(folder, info)


LLAMA_CONFIG = {**SHAPE, "model_type": "llama"}


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope_type"),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_type"),
        ({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}}, "partial"),
        ({"rope_parameters": {**LLAMA3_ROPE, "factor": None}}, "factor"),
        ({"rope_parameters": {"full_attention": {"rope_type": "default"}}}, "per layer type"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"attention_bias": True}, "attention_bias"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"attention_dropout": 0.1}, "attention_dropout"),
        ({"model_type": "qwen2"}, "model_type"),
        ({"hidden_size": None}, "hidden_size"),
    ],
)
def test_what_the_model_cannot_reproduce_is_refused_by_key(config: dict, key: str) -> None:
    fields = {k: v for k, v in {**LLAMA_CONFIG, **config}.items() if v is not None}
    with pytest.raises(ValueError, match=key):
        llama_fields(fields)


def test_mistral_ignores_the_bias_flags_as_transformers_does() -> None:
    mistral = {**SHAPE, "model_type": "mistral", "attention_bias": True, "mlp_bias": True}
    assert llama_fields(mistral)["dim"] == 64
