"""``torchkube prepare-data`` and ``torchkube export``: the trainer's command-line entries
(torch is imported by the commands, not here)."""

import sys
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from torchkube.api.contract import ExitCode
from torchkube.api.data import DataSource
from torchkube.api.data import Tokenizer as Requested

TOKENIZERS = ("auto", "gpt2", "bytes")


class TokenizerOption(click.ParamType):
    """A tokenizer's name, or a folder: a name wins, so a folder called ``bytes`` is
    ``./bytes``."""

    name = "tokenizer"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> Requested | Path:
        if isinstance(value, Path) or value in TOKENIZERS:
            return value
        if not Path(value).is_dir():
            self.fail(f"{value!r} is not auto, gpt2, bytes or a tokenizer folder", param, ctx)
        return Path(value)


@click.command("prepare-data")
@click.argument("inputs", nargs=-1, type=click.Path(exists=True, path_type=Path))
@click.option(
    "--output",
    "-o",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for train.bin and val.bin (e.g. on the checkpoint or data volume).",
)
@click.option(
    "--val-fraction",
    default=0.05,
    show_default=True,
    type=click.FloatRange(0.0, 1.0, max_open=True),
    help="Share of the tokens, from the end, kept for evaluation.",
)
@click.option("--url", help="Read a text file (.gz: gzipped) from this http(s) URL instead.")
@click.option(
    "--source",
    "source_json",
    help="A TrainingJob's spec.data.source as JSON (what the operator's prepare pod passes).",
)
@click.option(
    "--claim-mount",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the claim of a claim source is mounted.",
)
@click.option(
    "--tokenizer",
    type=TokenizerOption(),
    metavar="[auto|gpt2|bytes|DIR]",
    default="bytes",
    show_default=True,
    help="gpt2 (tiktoken's GPT-2 BPE), bytes, auto (gpt2 when its vocabulary loads), or a "
    "folder with a Hugging Face tokenizer.json, such as spec.trainer.weightsPath's (needs the "
    "tokenizers package; vocabularies beyond 65,536 tokens get uint32 token files).",
)
@click.option(
    "--report",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the result as JSON here (a pod's /dev/termination-log), or the error.",
)
@click.option(
    "--sample",
    is_flag=True,
    help="Tokenise the generated sample corpus instead of INPUTS (quick start, tests).",
)
@click.option(
    "--sample-docs",
    default=2000,
    show_default=True,
    type=click.IntRange(1),
    help="Paragraphs in the sample corpus.",
)
def prepare_data(
    inputs: tuple[Path, ...],
    output: Path,
    val_fraction: float,
    url: str | None,
    source_json: str | None,
    claim_mount: Path | None,
    tokenizer: Requested | Path,
    report: Path | None,
    sample: bool,
    sample_docs: int,
) -> None:
    """Tokenise text into token files for training: INPUTS (text files or folders of
    .txt/.md/.rst files), a --url, a job's --source, or the --sample corpus.

    Written in llm.c's token-file format with a PREPARED.json marker; a second run for the same
    source finds the marker and does nothing. Point spec.trainer.dataPath at OUTPUT/train.bin,
    or let the job do all of this with spec.data. Exit code 3 means retrying cannot help (a
    missing path, an HTTP 4xx, GPT-2 asked for without its vocabulary, a tokenizer folder
    without the tokenizers package).
    """
    from torchkube.trainer import prepare

    given = [bool(inputs), url is not None, source_json is not None, sample]
    if sum(given) != 1:
        raise click.UsageError("give exactly one of INPUTS, --url, --source or --sample")
    if sample and tokenizer != "bytes":
        raise click.UsageError("--sample is byte-level: leave --tokenizer out")
    if sample:
        result = prepare.prepare_sample(output, sample_docs, val_fraction)
        click.echo(f"{result.documents} documents → {result.train.path}")
        return
    try:
        source = (
            DataSource.model_validate_json(source_json)
            if source_json is not None
            else DataSource(url=url)
            if url is not None
            else None
        )
    except ValidationError as error:
        raise click.UsageError(f"--source is not a data source: {error}") from error
    _run(source, inputs, output, val_fraction, claim_mount, tokenizer, report)


def _run(
    source: DataSource | None,
    inputs: tuple[Path, ...],
    output: Path,
    val_fraction: float,
    claim_mount: Path | None,
    tokenizer: Requested | Path,
    report: Path | None,
) -> None:
    """Prepare, print what was written, and end with the contract's exit codes."""
    from torchkube.trainer.prepare import prepare_source
    from torchkube.trainer.sources import SourceError
    from torchkube.trainer.tokenizers import TokenizerUnavailable

    sources = [source] if source else [DataSource(path=str(p.resolve())) for p in inputs]
    try:
        if len(sources) != 1:
            raise SourceError("give one input (a file or a folder of text files)", True)
        result = prepare_source(sources[0], output, tokenizer, val_fraction, claim_mount)
    except (SourceError, TokenizerUnavailable, ValueError, OSError) as error:
        permanent = not isinstance(error, SourceError | OSError) or getattr(
            error, "permanent", False
        )
        message = f"torchkube prepare-data: {error}"
        if report is not None:
            report.write_text(message[:4000])
        click.echo(message, err=True)
        sys.exit(ExitCode.CONFIG_ERROR if permanent else ExitCode.FAILURE)
    if report is not None:
        report.write_text(result.model_dump_json(by_alias=True, exclude_none=True))
    done = "already there" if result.reused else "written"
    click.echo(
        f"{result.documents} documents from {result.source} → {output} ({done}): "
        f"{result.train_tokens:,} training and {result.val_tokens:,} validation tokens, "
        f"tokenizer {result.tokenizer}"
    )
    if result.tokenizer_note:
        click.echo(f"note: {result.tokenizer_note}")


@click.command("export")
@click.argument("checkpoint", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option(
    "--format",
    "format_",
    type=click.Choice(["hf"]),
    required=True,
    help="hf: a Hugging Face folder that transformers' AutoModelForCausalLM loads.",
)
@click.option(
    "--dtype",
    type=click.Choice(["float32", "bfloat16", "float16"]),
    help="The weights' type in OUT (default: as the checkpoint stores them, fp32).",
)
@click.option(
    "--tokenizer",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Copy this folder's tokenizer files along (the job's weightsPath).",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The model's config.json, for a checkpoint that records none.",
)
@click.option(
    "--max-file-mib",
    type=click.IntRange(1),
    default=5 * 1024,
    show_default=True,
    help="Split the weights into files of at most this size, with an index.",
)
def export(
    checkpoint: Path,
    out: Path,
    format_: str,
    dtype: str | None,
    tokenizer: Path | None,
    config_file: Path | None,
    max_file_mib: int,
) -> None:
    """Write a checkpoint's model to the new folder OUT in another format.

    CHECKPOINT is a step-N folder, or a checkpoint folder (its newest complete step-N). The
    model is read one tensor at a time, whichever strategy and mesh wrote it. Exit code 3: the
    checkpoint cannot be exported (incomplete, no model config, a GPT) or OUT exists.
    """
    import json

    import torch

    from torchkube.trainer.export import export_hf, newest_checkpoint

    try:
        source = newest_checkpoint(checkpoint)
        files = export_hf(
            source,
            out,
            dtype=getattr(torch, dtype) if dtype else None,
            config=json.loads(config_file.read_text()) if config_file else None,
            tokenizer=tokenizer,
            max_file_bytes=max_file_mib * 2**20,
        )
    except (ValueError, OSError) as error:
        click.echo(f"torchkube export: {error}", err=True)
        sys.exit(ExitCode.CONFIG_ERROR)
    click.echo(f"{source} → {out} ({format_}): {len(files)} weight file(s)")
