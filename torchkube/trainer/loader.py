"""How one trainer process learns what to do: the TrainerSpec, the pod's environment, and flags.

No torch here: a bad spec, a missing data file or an unwritable checkpoint folder is reported
in well under a second, before a GPU or a process group is touched.

Layering, last wins: spec defaults < ``TORCHKUBE_TRAINER_CONFIG`` (JSON, camelCase, what the
operator sets) < ``--config FILE`` (YAML or JSON) < ``--field=value`` flags (any TrainerSpec
field as camelCase, snake_case or kebab-case; a nested one as ``--parallelism.tensor=2``);
nested objects merge key by key. Unknown keys are errors, as in nanoGPT's configurator.
Runtime settings that describe the pod rather than the job come from the ``TORCHKUBE_*``
variables below and may be overridden by the matching flags.
"""

import argparse
import json
import os
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import ValidationError

from torchkube.api.contract import TERMINATION_LOG, Env
from torchkube.api.errors import describe
from torchkube.api.spec import CheckpointMode, CheckpointSpec
from torchkube.api.trainer import TrainerSpec
from torchkube.trainer import hf
from torchkube.trainer.tokens import BYTE_VOCAB_SIZE, read_header, resolve_token_files

MIN_CHECKPOINT_KEEP = 2  # the newest checkpoint and a fallback, should the newest not load
_CHECKPOINT = CheckpointSpec()


class ConfigError(Exception):
    """A permanent user or configuration error: retrying cannot help (exit code 3)."""


SLOT_DIGITS = 5
"""Enough for every slot the API allows: ``replicas.max`` ≤ 10,000 and ``replicas.spares`` ≤
1,000."""


@dataclass(frozen=True)
class LiveEnv:
    """The pod's side of the live-recovery contract (``failurePolicy.recovery: live``)."""

    lighthouse: str
    """The torchft Lighthouse that forms each step's quorum (``http://host:port``)."""
    slot: int = 0
    """The pod's replica index: its replica group's id is ``<job>-<slot>``."""
    host: str = "localhost"
    """Where the other groups reach this one (its Manager and the state it serves to a joining
    group): the pod IP, as a pod's host name resolves nowhere; outside a pod the host name."""
    target: int | None = None
    """Replica groups that train (``Env.REPLICA_GROUPS``); None: every group trains."""

    def replica_id(self, job_name: str) -> str:
        """``<job>-<slot>``, the slot zero-padded: torchft's Lighthouse ranks a quorum's groups
        by their ids as strings, so the groups' ranks follow their slots (which Kueue's
        topology-aware scheduling assigns in topology order); the slot is read back from the
        digits."""
        return f"{job_name}-{self.slot:0{SLOT_DIGITS}d}"


def _live_env(environ: Mapping[str, str]) -> LiveEnv:
    lighthouse = environ.get(Env.LIGHTHOUSE, "")
    if not lighthouse:
        raise ConfigError(
            f"failurePolicy.recovery live needs a torchft Lighthouse ({Env.LIGHTHOUSE}): "
            "the operator and torchkube run start one for every live job"
        )
    return LiveEnv(
        lighthouse=lighthouse,
        slot=_env_value(environ, Env.REPLICA_INDEX, int, 0),
        host=environ.get(Env.POD_IP) or socket.gethostname(),
        target=_env_value(environ, Env.REPLICA_GROUPS, int, None),
    )


@dataclass(frozen=True)
class RunEnv:
    """The pod's side of the contract with the operator (one value per ``TORCHKUBE_*`` variable).

    Checkpoint defaults are ``spec.checkpoint``'s, so a trainer started by hand checkpoints as
    a job with the default spec would."""

    job_name: str = "local"
    checkpoint_dir: Path | None = None
    checkpoint_interval_steps: int = _CHECKPOINT.interval_steps  # 0: no step-based checkpoints
    checkpoint_interval_seconds: float = 0.0  # 0: no time-based checkpoints
    checkpoint_keep: int = _CHECKPOINT.keep  # at least MIN_CHECKPOINT_KEEP
    checkpoint_mode: CheckpointMode = _CHECKPOINT.mode
    metrics_port: int = 0  # 0: no metrics server
    termination_log: Path | None = None
    elastic_restart_count: int = 0  # torchrun's TORCHELASTIC_RESTART_COUNT
    rank: int = 0
    world_size: int = 1
    pod_name: str | None = None
    node_name: str | None = None
    rendezvous_endpoint: str | None = None
    """The job's store (``host:port``), where the boards of in-place restarts and of the live
    quorum are posted; None outside a launcher."""
    recovery: Literal["restart", "live"] = "restart"  # failurePolicy.recovery
    live: LiveEnv | None = None
    """The live-recovery contract; set whenever ``recovery`` is ``live``."""


# Runtime flag → (RunEnv field, environment variable, parser).
_RUNTIME_FLAGS: dict[str, tuple[str, str, type]] = {
    "--job-name": ("job_name", Env.JOB_NAME, str),
    "--checkpoint-dir": ("checkpoint_dir", Env.CHECKPOINT_DIR, Path),
    "--checkpoint-interval-steps": (
        "checkpoint_interval_steps",
        Env.CHECKPOINT_INTERVAL_STEPS,
        int,
    ),
    "--checkpoint-interval-seconds": (
        "checkpoint_interval_seconds",
        Env.CHECKPOINT_INTERVAL_SECONDS,
        float,
    ),
    "--checkpoint-keep": ("checkpoint_keep", Env.CHECKPOINT_KEEP, int),
    "--checkpoint-mode": ("checkpoint_mode", Env.CHECKPOINT_MODE, str),
    "--metrics-port": ("metrics_port", Env.METRICS_PORT, int),
}


def _arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m torchkube.trainer",
        description="Train a model with torchkube (run it under torchrun for several processes).",
        epilog="Any TrainerSpec field can be set as --fieldName=value (e.g. --steps=200).",
    )
    parser.add_argument("--config", type=Path, help="TrainerSpec as a YAML or JSON file")
    for flag, (_, env, _) in _RUNTIME_FLAGS.items():
        parser.add_argument(flag, help=f"overrides ${env}")
    return parser


def _field_name(key: str) -> str:
    """A spec key as its Python field name; unknown keys come back unchanged for pydantic."""
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", key.replace("-", "_")).lower()
    return snake if snake in TrainerSpec.model_fields else key


def _normalise(layer: Mapping[str, Any], source: str) -> dict[str, Any]:
    if not isinstance(layer, Mapping):
        raise ConfigError(f"{source} must hold a mapping of TrainerSpec fields")
    return {_field_name(str(k)): v for k, v in layer.items()}


def _flag_overrides(extra: Sequence[str]) -> dict[str, Any]:
    """``--key=value`` / ``--key value`` pairs left over by argparse; ``--outer.inner=value``
    sets a field of a nested object (``--parallelism.tensor=2``)."""
    out: dict[str, Any] = {}
    items = list(extra)
    while items:
        item = items.pop(0)
        if not item.startswith("--") or item == "--":
            raise ConfigError(f"unexpected argument {item!r}; spec fields are set as --field=value")
        key, sep, value = item[2:].partition("=")
        if not sep:
            if not items or items[0].startswith("--"):
                raise ConfigError(f"option --{key} needs a value")
            value = items.pop(0)
        outer, _, inner = key.partition(".")
        name = _field_name(outer)
        if name not in TrainerSpec.model_fields:
            raise ConfigError(f"unknown option --{key}: not a TrainerSpec field")
        out = _merge(out, {name: {inner: value} if inner else value})
    return out


def _merge(base: dict[str, Any], layer: Mapping[str, Any]) -> dict[str, Any]:
    """``layer`` over ``base``; nested objects are merged key by key, not replaced."""
    merged = dict(base)
    for key, value in layer.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def format_validation_error(err: ValidationError) -> str:
    """A pydantic error as one line (the trainer's exit message) naming each field."""
    return "invalid trainer config: " + "; ".join(describe(err).splitlines())


def _env_value(environ: Mapping[str, str], name: str, parse: type, default: Any) -> Any:
    raw = environ.get(name, "")
    if raw == "":
        return default
    try:
        return parse(raw)
    except ValueError as e:
        raise ConfigError(
            f"environment variable {name}={raw!r} is not a valid {parse.__name__}"
        ) from e


def load_config(
    argv: Sequence[str], environ: Mapping[str, str] | None = None
) -> tuple[TrainerSpec, RunEnv]:
    """Parse flags and environment into a validated spec and run environment (or ConfigError)."""
    environ = os.environ if environ is None else environ
    args, extra = _arg_parser().parse_known_args(list(argv))

    merged: dict[str, Any] = {}
    if environ.get(Env.TRAINER_CONFIG):
        try:
            env_layer = json.loads(environ[Env.TRAINER_CONFIG])
        except json.JSONDecodeError as e:
            raise ConfigError(f"${Env.TRAINER_CONFIG} is not valid JSON: {e}") from e
        merged = _merge(merged, _normalise(env_layer, f"${Env.TRAINER_CONFIG}"))
    if args.config is not None:
        try:
            text = args.config.read_text()
        except OSError as e:
            raise ConfigError(f"cannot read config file {args.config}: {e.strerror or e}") from e
        try:
            file_layer = yaml.safe_load(text) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {args.config} is not valid YAML/JSON: {e}") from e
        merged = _merge(merged, _normalise(file_layer, str(args.config)))
    merged = _merge(merged, _flag_overrides(extra))
    try:
        spec = TrainerSpec.model_validate(merged)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e)) from e

    values: dict[str, Any] = {}
    for flag, (field, env, parse) in _RUNTIME_FLAGS.items():
        raw = getattr(args, flag[2:].replace("-", "_"))
        if raw is not None:
            try:
                values[field] = parse(raw)
            except ValueError as e:
                raise ConfigError(f"{flag}={raw!r} is not a valid {parse.__name__}") from e
        else:
            values[field] = _env_value(environ, env, parse, getattr(RunEnv, field))
    for field in (
        "checkpoint_interval_steps",
        "checkpoint_interval_seconds",
        "checkpoint_keep",
        "metrics_port",
    ):
        if values[field] < 0:
            raise ConfigError(f"{field.replace('_', ' ')} must not be negative ({values[field]})")
    if values["checkpoint_keep"] < MIN_CHECKPOINT_KEEP:
        raise ConfigError(
            f"checkpoint keep must be at least {MIN_CHECKPOINT_KEEP}, not "
            f"{values['checkpoint_keep']}: the newest checkpoint can turn out unloadable "
            "(a disk error after it was written), and the one before it is then the only way "
            f"back; set spec.checkpoint.keep ({Env.CHECKPOINT_KEEP}) to 2 or more"
        )
    if values["checkpoint_mode"] not in get_args(CheckpointMode):
        raise ConfigError(
            f"checkpoint mode must be async or sync, not {values['checkpoint_mode']!r} "
            f"(spec.checkpoint.mode, {Env.CHECKPOINT_MODE})"
        )
    recovery = environ.get(Env.RECOVERY) or "restart"
    if recovery not in ("restart", "live"):
        raise ConfigError(
            f"{Env.RECOVERY} must be restart or live, not {recovery!r} (failurePolicy.recovery)"
        )
    log = environ.get(Env.TERMINATION_LOG, str(TERMINATION_LOG))
    run_env = RunEnv(
        **values,
        termination_log=Path(log) if log and Path(log).exists() else None,
        elastic_restart_count=_env_value(environ, "TORCHELASTIC_RESTART_COUNT", int, 0),
        rank=_env_value(environ, "RANK", int, 0),
        world_size=_env_value(environ, "WORLD_SIZE", int, 1),
        pod_name=environ.get(Env.POD_NAME) or None,
        node_name=environ.get(Env.NODE_NAME) or None,
        rendezvous_endpoint=environ.get(Env.RENDEZVOUS_ENDPOINT) or None,
        recovery="live" if recovery == "live" else "restart",
        live=_live_env(environ) if recovery == "live" else None,
    )
    return spec, run_env


def _check_token_files(pattern: str, field: str, seq_len: int) -> None:
    try:
        files = resolve_token_files(pattern)
        infos = [read_header(f) for f in files]
    except ValueError as e:
        raise ConfigError(f"{field}: {e}") from e
    if not any(info.num_tokens > seq_len for info in infos):
        raise ConfigError(
            f"{field}: {pattern} holds no file with more than seqLen ({seq_len}) tokens, "
            "so not a single training sequence"
        )


def preflight(spec: TrainerSpec, run_env: RunEnv) -> None:
    """Reject what can never work before any process group exists (raises ConfigError)."""
    if spec.data_path:
        _check_token_files(spec.data_path, "dataPath", spec.seq_len)
    if spec.eval_data_path:
        _check_token_files(spec.eval_data_path, "evalDataPath", spec.seq_len)
    if spec.weights_path:
        _check_weights(spec)
    if run_env.checkpoint_dir is not None:
        probe = run_env.checkpoint_dir / f".write-test-{socket.gethostname()}-{os.getpid()}"
        try:
            run_env.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"ok")
            probe.unlink()
        except OSError as e:
            raise ConfigError(
                f"checkpoint directory {run_env.checkpoint_dir} is not writable: {e.strerror or e}"
            ) from e


def _check_weights(spec: TrainerSpec) -> None:
    """The weights folder holds a model ``llama.py`` computes like its publishers do, and the
    data fits it: token ids inside its vocabulary, made by its tokenizer when it has one."""
    assert spec.weights_path is not None
    folder = Path(spec.weights_path)
    try:
        vocab = hf.llama_fields(hf.read_config(folder))["vocab_size"]
        hf.tensor_entries(folder)
        tokenizer = hf.tokenizer_vocab_size(folder)
    except ValueError as e:
        raise ConfigError(f"weightsPath: {e}") from e
    if spec.vocab_size is not None and spec.vocab_size != vocab:
        raise ConfigError(
            f"vocabSize ({spec.vocab_size}) differs from the vocab_size of weightsPath's "
            f"config.json ({vocab}): leave vocabSize unset"
        )
    data = (
        max(read_header(f).vocab_size for f in resolve_token_files(spec.data_path))
        if spec.data_path
        else BYTE_VOCAB_SIZE  # the sample corpus
    )
    source = f"dataPath ({spec.data_path})" if spec.data_path else "the sample corpus"
    if data > vocab:
        raise ConfigError(
            f"{source} holds token ids up to {data - 1}, outside the {vocab}-token vocabulary "
            f"of weightsPath's model"
        )
    if tokenizer is not None and tokenizer != data:
        raise ConfigError(
            f"{source} was tokenised with a {data}-token vocabulary, but the tokenizer in "
            f"weightsPath has {tokenizer} tokens: tokenise the data with it "
            f"(torchkube prepare-data --tokenizer {folder})"
        )
