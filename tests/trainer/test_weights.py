"""Starting weights in one process (world size 1, gloo): a Hugging Face folder written and
read back through DCP — several files, bf16 into fp32, a tied head left out — what a folder
that does not fit is told, and the seeded initialisation. The trainer's exit code for such a
folder: test_train.py."""

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from torchkube.trainer.distributed import DistInfo
from torchkube.trainer.hf import INDEX_FILE, read_config, tensor_entries
from torchkube.trainer.llama import PRESETS, Llama
from torchkube.trainer.weights import init_sharded, load_pretrained, save_pretrained


def tiny(seed: int, **changes: object) -> Llama:
    torch.manual_seed(seed)
    return Llama(replace(PRESETS["mistral-tiny"], vocab_size=96, **changes))  # type: ignore[arg-type]


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name


def test_a_folder_of_several_files_loads_back_exactly(tmp_path: Path, info: DistInfo) -> None:
    saved = tiny(seed=1)
    save_pretrained(saved, tmp_path, max_file_bytes=40_000)
    assert (tmp_path / INDEX_FILE).is_file() and len(list(tmp_path.glob("*.safetensors"))) > 2
    assert read_config(tmp_path)["model_type"] == "mistral"
    assert "model.layers.1.mlp.down_proj.weight" in tensor_entries(tmp_path)
    loaded = tiny(seed=2)
    read = load_pretrained(loaded, tmp_path, info.checkpoint_group)
    assert_same_weights(loaded, saved)
    assert read == sum(p.numel() * 4 for p in saved.parameters())  # one process reads it all


def test_bf16_files_load_into_fp32_weights(tmp_path: Path, info: DistInfo) -> None:
    saved = tiny(seed=1).to(torch.bfloat16)
    save_pretrained(saved, tmp_path)
    loaded = tiny(seed=2)
    load_pretrained(loaded, tmp_path, info.checkpoint_group)
    assert all(p.dtype == torch.float32 for p in loaded.parameters())
    assert_same_weights(loaded.to(torch.bfloat16), saved)


def test_a_tied_head_may_be_left_out(tmp_path: Path, info: DistInfo) -> None:
    saved = tiny(seed=1, tie_embeddings=True)
    save_pretrained(saved, tmp_path)
    assert "lm_head.weight" not in tensor_entries(tmp_path)
    loaded = tiny(seed=2, tie_embeddings=True)
    load_pretrained(loaded, tmp_path, info.checkpoint_group)
    assert loaded.lm_head.weight is loaded.embed_tokens.weight
    assert_same_weights(loaded, saved)


def test_folders_that_do_not_fit_the_model_are_named(tmp_path: Path, info: DistInfo) -> None:
    save_pretrained(tiny(seed=1, tie_embeddings=True), tmp_path / "tied")
    with pytest.raises(ValueError, match=r"lacks weights for lm_head\.weight"):
        load_pretrained(tiny(seed=1), tmp_path / "tied", info.checkpoint_group)
    save_pretrained(tiny(seed=1), tmp_path / "untied")
    wider = Llama(replace(PRESETS["mistral-tiny"], vocab_size=128))
    with pytest.raises(
        ValueError, match=r"embed_tokens\.weight is \[96, 64\] in .*'s is \[128, 64\]"
    ):
        load_pretrained(wider, tmp_path / "untied", info.checkpoint_group)


def test_seeded_init_of_a_materialised_model_is_the_models_own(info: DistInfo) -> None:
    """What a sharded model gets from the seed: here one shard, the whole model."""
    model = tiny(seed=5)
    with torch.device("meta"):
        empty = tiny(seed=0)
    empty.to_empty(device="cpu")
    init_sharded(empty, empty.initial_value, seed=5)
    assert_same_weights(empty, model)
    assert not torch.equal(tiny(seed=6).lm_head.weight, model.lm_head.weight)
