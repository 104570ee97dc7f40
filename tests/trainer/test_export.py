"""Checkpoints taken away as Hugging Face folders, with transformers as the oracle: the
exported folder loads with ``AutoModelForCausalLM.from_pretrained`` and computes the logits
of the model the checkpoint holds. In one process here (a DDP checkpoint; the job option with
a tokenizer; the command line); from FSDP2 and tensor × FSDP2 checkpoints written by real
torchrun in test_tensor_parallel.py."""

import json
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
import transformers
from click.testing import CliRunner
from trainer_harness import relative_error, spec_args

from torchkube.api.contract import ExitCode
from torchkube.cli.main import main
from torchkube.trainer import RunEnv, load_config, run
from torchkube.trainer.checkpoint import HF_CONFIG, MARKER
from torchkube.trainer.export import export_hf
from torchkube.trainer.hf import INDEX_FILE, llama_fields, read_config
from torchkube.trainer.llama import Llama, LlamaConfig

FP32_TOLERANCE = 1e-5
BF16_TOLERANCE = 2e-2
STEPS = 3


def checkpoint_model(checkpoint: Path) -> Llama:
    """The model a checkpoint holds, read whole with DCP into our own Llama."""
    marker = json.loads((checkpoint / MARKER).read_text())
    config = LlamaConfig(**llama_fields(marker[HF_CONFIG]))
    model = Llama(config)
    state = {
        name: tensor
        for name, tensor in model.state_dict().items()
        if not (config.tie_embeddings and name == "lm_head.weight")
    }
    dcp.load({"model": state}, checkpoint_id=checkpoint, no_dist=True)
    return model.eval()


def assert_transformers_computes_the_checkpoint(
    checkpoint: Path, folder: Path, dtype: torch.dtype = torch.float32
) -> None:
    """transformers' model of the exported folder against the checkpoint's own model."""
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    ours = checkpoint_model(checkpoint)
    vocab = ours.config.vocab_size
    tokens = torch.randint(vocab, (2, 48), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        error = relative_error(ours(tokens), theirs(tokens).logits)
    tolerance = FP32_TOLERANCE if dtype == torch.float32 else BF16_TOLERANCE
    assert error < tolerance, f"logits differ from the checkpoint's model by {error:.1e}"


def assert_exports_to_transformers(checkpoint: Path, out: Path, **options: object) -> None:
    export_hf(checkpoint, out, **options)  # type: ignore[arg-type]
    assert_transformers_computes_the_checkpoint(checkpoint, out)


def train(data: Path, ckpt: Path, **overrides: object) -> None:
    job = {"model": "llama-tiny", "steps": STEPS, "warmupSteps": 1, "logIntervalSteps": 1}
    job |= overrides
    spec, _ = load_config(spec_args(data, **job), {})
    assert run(spec, RunEnv(checkpoint_dir=ckpt, checkpoint_interval_steps=10)) == ExitCode.OK


@pytest.fixture(scope="module")
def trained(token_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The final checkpoint of a short llama-tiny run in one process."""
    ckpt = tmp_path_factory.mktemp("export") / "ckpt"
    train(token_data, ckpt)
    return ckpt / f"step-{STEPS}"


def test_a_checkpoint_exports_to_what_transformers_computes(trained: Path, tmp_path: Path) -> None:
    assert_exports_to_transformers(trained, tmp_path / "one")
    assert read_config(tmp_path / "one")["rope_parameters"]["rope_type"] == "default"
    assert_exports_to_transformers(trained, tmp_path / "sharded", max_file_bytes=40_000)
    assert (tmp_path / "sharded" / INDEX_FILE).is_file()
    assert len(list((tmp_path / "sharded").glob("model-*-of-*.safetensors"))) > 2
    export_hf(trained, tmp_path / "bf16", dtype=torch.bfloat16)
    assert read_config(tmp_path / "bf16")["dtype"] == "bfloat16"
    assert_transformers_computes_the_checkpoint(trained, tmp_path / "bf16", torch.bfloat16)


def test_the_command_exports_the_newest_checkpoint(trained: Path, tmp_path: Path) -> None:
    out = tmp_path / "hf"
    result = CliRunner().invoke(
        main, ["export", str(trained.parent), "--format", "hf", str(out), "--max-file-mib", "1"]
    )
    assert result.exit_code == 0, result.output
    assert f"{trained} → {out} (hf)" in result.output
    assert_transformers_computes_the_checkpoint(trained, out)
    again = CliRunner().invoke(main, ["export", str(trained), "--format", "hf", str(out)])
    assert again.exit_code == ExitCode.CONFIG_ERROR and "exists" in again.output


def test_what_cannot_be_exported_is_named(token_data: Path, trained: Path, tmp_path: Path) -> None:
    train(token_data, tmp_path / "gpt", model="tiny")
    with pytest.raises(ValueError, match="records no model config"):
        export_hf(tmp_path / "gpt" / f"step-{STEPS}", tmp_path / "out")
    config = json.loads((trained / MARKER).read_text())[HF_CONFIG]
    with pytest.raises(ValueError, match=r"embed_tokens\.weight is \[320, 64\] in .*\[96, 64\]"):
        export_hf(trained, tmp_path / "out", config={**config, "vocab_size": 96})
    assert not (tmp_path / "out").exists()


def byte_tokenizer(folder: Path, vocab: int) -> None:
    """tokenizer.json and tokenizer_config.json of a ``vocab``-token vocabulary (the loader
    checks the data against its size; the export copies the files)."""
    tokens = {f"<{i}>": i for i in range(vocab)}
    (folder / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": tokens}}))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": f"<{vocab - 1}>"}))


def test_the_job_exports_its_final_checkpoint_with_its_tokenizer(
    token_data: Path, tmp_path: Path
) -> None:
    """Bring a tied Llama saved by transformers, train it, take it away: exportFormat hf
    writes hf-step-N beside the checkpoints, with weightsPath's tokenizer."""
    weights = tmp_path / "weights"
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=257,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        bos_token_id=255,
        eos_token_id=256,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(weights)
    byte_tokenizer(weights, 257)
    ckpt = tmp_path / "ckpt"
    train(token_data, ckpt, weightsPath=str(weights), exportFormat="hf")
    out = ckpt / f"hf-step-{STEPS}"
    assert (out / "tokenizer.json").read_bytes() == (weights / "tokenizer.json").read_bytes()
    assert (out / "tokenizer_config.json").is_file()
    exported = read_config(out)
    assert exported["tie_word_embeddings"] is True
    assert (exported["bos_token_id"], exported["eos_token_id"]) == (255, 256)
    assert_transformers_computes_the_checkpoint(ckpt / f"step-{STEPS}", out)


def test_the_job_export_is_no_hang_to_the_launchers_watchdog(
    token_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading and writing a large model takes longer than a step's hang timeout: the export
    runs as a phase between steps, judged against the collective timeout like a checkpoint."""
    from torchkube.elastic.heartbeat import Heartbeat
    from torchkube.trainer import train as training

    heartbeat = Heartbeat(None)
    monkeypatch.setattr(Heartbeat, "from_env", classmethod(lambda cls, *a: heartbeat))
    seen: list[str | None] = []
    monkeypatch.setattr(
        training, "export_final", lambda *a: seen.append(heartbeat.snapshot().paused)
    )
    train(token_data, tmp_path / "ckpt", exportFormat="hf")
    assert seen == ["export"]
