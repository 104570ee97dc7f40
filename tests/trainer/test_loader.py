"""TrainerSpec validation, config layering (env < file < flags), the run environment and the
pre-flight checks — all without torch."""

import json
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from torchkube.api.contract import Env
from torchkube.api.trainer import TrainerSpec
from torchkube.trainer.loader import ConfigError, LiveEnv, load_config, preflight

ENV_CONFIG, ENV_CHECKPOINT_DIR = Env.TRAINER_CONFIG, Env.CHECKPOINT_DIR


def test_spec_defaults_and_camel_case_wire_form() -> None:
    spec = TrainerSpec()
    assert (spec.model, spec.strategy, spec.precision) == ("gpt2", "ddp", "auto")
    wire = TrainerSpec(micro_batch_size=4).to_wire()
    assert wire["microBatchSize"] == 4 and "micro_batch_size" not in wire
    assert TrainerSpec.model_validate(wire) == TrainerSpec(micro_batch_size=4)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"globalBatchSize": 20, "microBatchSize": 8}, "globalBatchSize (20) must be a multiple"),
        ({"warmupSteps": 50, "steps": 10}, "warmupSteps (50) must not exceed steps (10)"),
        ({"hsdpShardSize": 2}, "hsdpShardSize is only used with strategy hsdp"),
        ({"dataPath": "/d/train.bin", "evalIntervalSteps": 10}, "needs evalDataPath"),
        ({"strategy": "pipeline"}, "strategy"),
        ({"microBatchSize": 0}, "microBatchSize"),
        ({"learningRate": 0}, "learningRate"),
        ({"unknownKnob": 1}, "unknownKnob"),
    ],
)
def test_spec_rejects_bad_input_naming_the_field(fields: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        TrainerSpec.model_validate(fields)


def test_grad_accumulation_keeps_the_global_batch_at_every_world_size() -> None:
    """Micro-steps per worker: the fewest that hold the global batch; uneven splits included."""
    spec = TrainerSpec(micro_batch_size=4, global_batch_size=32)
    assert [spec.grad_accum_steps(w) for w in (1, 2, 3, 4, 5, 8, 64)] == [8, 4, 3, 2, 2, 1, 1]


def test_schema_is_structural_and_carries_the_cross_field_rules() -> None:
    """The CRD generator needs descriptions everywhere and unions only of the X | None kind."""
    schema = TrainerSpec.model_json_schema(by_alias=True)
    nested = schema.pop("$defs", {})  # nested spec models, which the CRD generator inlines
    assert list(nested) == ["ParallelismSpec"]
    for model in (schema, *nested.values()):
        for name, prop in model["properties"].items():
            assert prop.get("description"), name
            assert "default" in prop or "$ref" in prop, name  # nested: the CRD renders it
            if "anyOf" in prop:
                assert len(prop["anyOf"]) == 2 and {"type": "null"} in prop["anyOf"], name
    rules = [r["rule"] for r in schema["x-kubernetes-validations"]]
    assert "self.globalBatchSize % self.microBatchSize == 0" in rules


def test_layering_env_then_file_then_flags(tmp_path: Path) -> None:
    config = tmp_path / "trainer.yaml"
    config.write_text("microBatchSize: 2\nsteps: 50\nlr_schedule: linear\nwarmupSteps: 5\n")
    env = {ENV_CONFIG: json.dumps({"model": "tiny", "steps": 10, "seqLen": 32})}
    spec, _ = load_config(
        ["--config", str(config), "--steps=70", "--learning-rate", "0.01", "--compile=true"], env
    )
    assert spec.model == "tiny" and spec.seq_len == 32  # env
    assert spec.micro_batch_size == 2 and spec.lr_schedule == "linear"  # file
    assert spec.steps == 70 and spec.learning_rate == 0.01 and spec.compile  # flags


def test_run_env_from_variables_and_flags(tmp_path: Path) -> None:
    env = {
        ENV_CHECKPOINT_DIR: str(tmp_path),
        "TORCHKUBE_JOB_NAME": "demo",
        "TORCHKUBE_CHECKPOINT_INTERVAL_STEPS": "50",
        "TORCHKUBE_CHECKPOINT_INTERVAL_SECONDS": "120",
        "TORCHKUBE_CHECKPOINT_KEEP": "2",
        "TORCHKUBE_METRICS_PORT": "9400",
        "TORCHELASTIC_RESTART_COUNT": "3",
        "RANK": "1",
        "WORLD_SIZE": "4",
    }
    _, run_env = load_config(["--checkpoint-keep=5"], env)
    assert run_env.checkpoint_dir == tmp_path and run_env.job_name == "demo"
    assert (run_env.checkpoint_interval_steps, run_env.checkpoint_interval_seconds) == (50, 120.0)
    assert run_env.checkpoint_keep == 5 and run_env.metrics_port == 9400
    assert (run_env.elastic_restart_count, run_env.rank, run_env.world_size) == (3, 1, 4)
    assert run_env.recovery == "restart" and run_env.live is None


def test_the_live_recovery_contract_is_read_once_with_the_rest() -> None:
    env = {
        "TORCHKUBE_JOB_NAME": "demo",
        "TORCHKUBE_RECOVERY": "live",
        "TORCHKUBE_LIGHTHOUSE": "http://rendezvous.demo.ns.svc:29401",
        "TORCHKUBE_REPLICA_INDEX": "2",
        "TORCHKUBE_REPLICA_GROUPS": "3",
        "TORCHKUBE_RENDEZVOUS_ENDPOINT": "rendezvous.demo.ns.svc:29400",
        "POD_IP": "10.0.0.7",
        "POD_NAME": "demo-worker-2",
        "NODE_NAME": "node-a",
    }
    _, run_env = load_config([], env)
    assert run_env.recovery == "live" and run_env.live is not None
    assert run_env.live.replica_id(run_env.job_name) == "demo-00002"
    assert (run_env.live.host, run_env.live.target) == ("10.0.0.7", 3)
    assert run_env.rendezvous_endpoint == "rendezvous.demo.ns.svc:29400"
    assert (run_env.pod_name, run_env.node_name) == ("demo-worker-2", "node-a")


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--stepz=3"], {}, "unknown option --stepz"),
        (["--steps"], {}, "needs a value"),
        (["stray"], {}, "unexpected argument"),
        (["--steps=-1"], {}, "steps: Input should be greater than or equal to 1"),
        ([], {ENV_CONFIG: "{not json"}, "is not valid JSON"),
        ([], {ENV_CONFIG: "[1, 2]"}, "must hold a mapping"),
        ([], {"TORCHKUBE_METRICS_PORT": "http"}, "TORCHKUBE_METRICS_PORT='http'"),
        ([], {"TORCHKUBE_CHECKPOINT_KEEP": "1"}, "keep must be at least 2"),
        (["--config", "/nonexistent/t.yaml"], {}, "cannot read config file"),
        ([], {"TORCHKUBE_RECOVERY": "live"}, "live needs a torchft Lighthouse"),
        ([], {"TORCHKUBE_RECOVERY": "hot"}, "must be restart or live, not 'hot'"),
    ],
)
def test_bad_config_is_one_config_error(argv: list[str], env: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(argv, env)


def test_preflight_rejects_missing_data_and_unwritable_checkpoints(
    tmp_path: Path, token_data: Path
) -> None:
    spec, run_env = load_config([f"--data-path={tmp_path / 'missing.bin'}"], {})
    with pytest.raises(ConfigError, match=r"dataPath: token file .*missing.bin does not exist"):
        preflight(spec, run_env)

    not_tokens = tmp_path / "text.bin"
    not_tokens.write_bytes(b"hello" * 400)
    spec, run_env = load_config([f"--data-path={not_tokens}"], {})
    with pytest.raises(ConfigError, match="is not a token file"):
        preflight(spec, run_env)

    a_file = tmp_path / "file"
    a_file.write_text("")
    spec, run_env = load_config(
        [f"--data-path={token_data / 'train.bin'}", f"--checkpoint-dir={a_file / 'ckpt'}"], {}
    )
    with pytest.raises(ConfigError, match=r"checkpoint directory .* is not writable"):
        preflight(spec, run_env)

    spec, run_env = load_config(  # 3 workers cannot split 16 evenly: they split it unevenly
        [
            f"--data-path={token_data / 'train.bin'}",
            "--global-batch-size=16",
            "--micro-batch-size=8",
        ],
        {"WORLD_SIZE": "3"},
    )
    preflight(spec, run_env)

    spec, run_env = load_config([f"--data-path={token_data / 'val.bin'}", "--seq-len=100000"], {})
    with pytest.raises(ConfigError, match="not a single training sequence"):
        preflight(spec, run_env)


def test_nested_fields_layer_and_take_dotted_flags(tmp_path: Path) -> None:
    config = tmp_path / "trainer.yaml"
    config.write_text("model: llama-tiny\nparallelism: {tensor: 4}\nseqLen: 64\n")
    spec, _ = load_config(["--config", str(config)], {})
    assert spec.parallelism.tensor == 4
    spec, _ = load_config(["--config", str(config), "--parallelism.tensor=2"], {})
    assert spec.parallelism.tensor == 2 and spec.model == "llama-tiny"
    with pytest.raises(ConfigError, match=r"parallelism\.tensr"):
        load_config(["--parallelism.tensr=2"], {})
    with pytest.raises(ConfigError, match=r"unknown option --paralelism\.tensor"):
        load_config(["--paralelism.tensor=2"], {})


def write_weights_folder(folder: Path, vocab: int, tokenizer_vocab: int | None = None) -> None:
    """A folder of the Hugging Face layout; only headers and config matter to pre-flight."""
    import struct

    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "vocab_size": vocab,
                "hidden_size": 8,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
            }
        )
    )
    header = json.dumps({"lm_head.weight": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})
    (folder / "model.safetensors").write_bytes(
        struct.pack("<Q", len(header)) + header.encode() + bytes(8)
    )
    if tokenizer_vocab is not None:
        vocab_map = {f"t{i}": i for i in range(tokenizer_vocab - 1)}
        tokenizer = {
            "model": {"type": "BPE", "vocab": vocab_map},
            "added_tokens": [{"id": tokenizer_vocab - 1}],
        }
        (folder / "tokenizer.json").write_text(json.dumps(tokenizer))


def test_preflight_checks_the_weights_folder_against_the_data(
    tmp_path: Path, token_data: Path
) -> None:
    """The sample data is byte-level: 257 token ids."""
    data = f"--data-path={token_data / 'train.bin'}"

    def check(folder: Path, *flags: str) -> None:
        spec, run_env = load_config(
            ["--model=llama-tiny", f"--weights-path={folder}", data, *flags], {}
        )
        preflight(spec, run_env)

    fits, small, other_tokenizer, same_tokenizer = (tmp_path / n for n in "abcd")
    write_weights_folder(fits, vocab=320)
    check(fits)
    with pytest.raises(ConfigError, match=r"vocabSize \(512\) differs .* \(320\)"):
        check(fits, "--vocab-size=512")
    write_weights_folder(small, vocab=200)
    with pytest.raises(ConfigError, match="token ids up to 256, outside the 200-token vocabulary"):
        check(small)
    write_weights_folder(other_tokenizer, vocab=32000, tokenizer_vocab=32000)
    with pytest.raises(
        ConfigError, match="tokenised with a 257-token vocabulary, but the tokenizer"
    ):
        check(other_tokenizer)
    write_weights_folder(same_tokenizer, vocab=320, tokenizer_vocab=257)
    check(same_tokenizer)
    with pytest.raises(ConfigError, match=r"weightsPath: cannot read .*config.json"):
        check(tmp_path / "nowhere")
    (fits / "model.safetensors").write_bytes(b"\x10" + bytes(7) + b"{}")
    with pytest.raises(ConfigError, match=r"weightsPath: .* is not a safetensors file"):
        check(fits)


def test_the_lighthouse_orders_replica_groups_by_slot() -> None:
    """torchft's Lighthouse ranks a quorum's groups by their replica ids as strings (and each
    Manager adds ``:<uuid>``): with ranks in slot order, as Kueue's topology-aware scheduling
    assigns slots, neighbouring groups are neighbours in the topology."""
    slots = [10, 2, 0, 1, 9999]
    ids = [f"{LiveEnv(lighthouse='http://l', slot=s).replica_id('demo')}:5f0c" for s in slots]
    assert [int(i.split(":")[0].rsplit("-", 1)[1]) for i in sorted(ids)] == sorted(slots)
