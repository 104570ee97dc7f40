"""``torchkube prepare-data``: the trainer's command-line entry (no torch imported here)."""

from pathlib import Path

import click


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
@click.option(
    "--sample",
    is_flag=True,
    help="Tokenise the generated sample corpus instead of INPUTS (quick start, tests).",
)
@click.option(
    "--tokenizer",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Tokenise with the Hugging Face tokenizer.json in this folder (the weights folder of "
    "spec.trainer.weightsPath) instead of bytes; needs the tokenizers package.",
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
    sample: bool,
    tokenizer: Path | None,
    sample_docs: int,
) -> None:
    """Tokenise text files (or folders of .txt/.md files) into token files for training.

    Byte-level tokens (vocabulary 257, one end-of-text token per file) unless --tokenizer
    names a Hugging Face tokenizer, written in llm.c's token-file format; point the
    TrainingJob's spec.trainer.dataPath at OUTPUT/train.bin.
    """
    from torchkube.trainer import prepare

    if sample == bool(inputs):
        raise click.UsageError("give INPUTS or --sample (exactly one of them)")
    if sample and tokenizer:
        raise click.UsageError("--sample is byte-level; --tokenizer needs INPUTS")
    try:
        encoder = prepare.hf_encoder(tokenizer) if tokenizer else prepare.BYTE_ENCODER
        result = (
            prepare.prepare_sample(output, sample_docs, val_fraction)
            if sample
            else prepare.prepare_text_files(inputs, output, val_fraction, encoder)
        )
    except (OSError, ValueError) as e:
        raise click.ClickException(str(e)) from e
    click.echo(
        f"{result.documents} documents → {result.train.path} ({result.train.num_tokens:,} tokens)"
    )
    if result.val is not None:
        click.echo(f"validation → {result.val.path} ({result.val.num_tokens:,} tokens)")
