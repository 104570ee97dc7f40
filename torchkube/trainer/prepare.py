"""``torchkube prepare-data``: text → token files, before a job starts.

Tokenisation happens here and never inside the training pods, so training reads a
memory-mapped file from the volume and needs no network and no tokenizer. Byte-level tokens
(vocab 257, see :mod:`torchkube.trainer.tokens`) are always there; GPT-2 BPE where tiktoken and
its vocabulary are; a weights folder's Hugging Face tokenizer where the ``tokenizers`` package
is (:mod:`torchkube.trainer.tokenizers`). Vocabularies beyond 65,536 tokens get llm.c's uint32
Llama 3 files. The trainer reads llm.c-format shards as they are, too.

:func:`prepare_source` is what a job's prepare pod runs (``spec.data``): read the source
(:mod:`torchkube.trainer.sources`), tokenise, write ``train.bin``/``val.bin`` and the
``PREPARED.json`` marker last, so a folder with the marker is complete and a second run for the
same source does nothing.
"""

import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from torchkube.api.contract import PREPARED_MARKER, PrepareReport
from torchkube.api.data import TRAIN_FILE, VAL_FILE, DataSource
from torchkube.trainer import corpus, sources
from torchkube.trainer.tokenizers import BYTES, Choice, Tokenizer, accepts, choose
from torchkube.trainer.tokens import TokenFileInfo, read_header, token_dtype, write_token_file

SAMPLE_VERSION = 1  # bump when the generated corpus changes, so stale caches are not reused


@dataclass(frozen=True)
class PrepareResult:
    """The files written and what they hold."""

    train: TokenFileInfo
    val: TokenFileInfo | None
    documents: int


def tokenize_documents(
    documents: Iterable[str], tokenizer: Tokenizer = BYTES
) -> tuple[np.ndarray, int]:
    """All documents as one token stream, each followed by the end-of-text token, in the
    token type of the vocabulary's files (uint32 beyond 65,536 tokens)."""
    dtype = token_dtype(tokenizer.vocab_size)
    parts: list[np.ndarray] = []
    eot = np.array([tokenizer.eot], dtype=dtype)
    count = 0
    for doc in documents:
        parts += [tokenizer.encode(doc).astype(dtype, copy=False), eot]
        count += 1
    return (np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)), count


def prepare_data(
    documents: Iterable[str],
    output_dir: Path,
    val_fraction: float = 0.05,
    tokenizer: Tokenizer = BYTES,
) -> PrepareResult:
    """Tokenise ``documents`` into ``train.bin`` and (when ``val_fraction`` > 0) ``val.bin``.

    The validation split is the tail of the token stream: deterministic, and no document
    order is assumed beyond the one given.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val fraction must be in [0, 1), got {val_fraction}")
    tokens, count = tokenize_documents(documents, tokenizer)
    if tokens.size < 2:
        raise ValueError("no text to tokenise: the inputs are empty")
    n_val = int(tokens.size * val_fraction)
    vocab = tokenizer.vocab_size
    train = write_token_file(output_dir / TRAIN_FILE, tokens[: tokens.size - n_val], vocab)
    val = write_token_file(output_dir / VAL_FILE, tokens[-n_val:], vocab) if n_val else None
    return PrepareResult(train, val, count)


def prepare_text_files(
    inputs: Iterable[Path], output_dir: Path, val_fraction: float
) -> PrepareResult:
    """:func:`prepare_data` over text files: each file is one document."""
    return prepare_data(sources.file_documents(inputs), output_dir, val_fraction)


def prepare_sample(
    output_dir: Path, num_docs: int = 2000, val_fraction: float = 0.05
) -> PrepareResult:
    """The generated sample corpus (:mod:`torchkube.trainer.corpus`) as token files."""
    return prepare_data(corpus.generate(num_docs), output_dir, val_fraction)


def sample_data_paths() -> tuple[str, str]:
    """Train and val files of the sample corpus, generated once per machine into the temp dir.

    Every process may call this at the same time: each writes whole files and renames them
    into place, and all of them produce identical bytes.
    """
    folder = Path(tempfile.gettempdir()) / f"torchkube-sample-corpus-v{SAMPLE_VERSION}"
    train, val = folder / "train.bin", folder / "val.bin"
    try:
        read_header(train)
        read_header(val)
    except ValueError:
        prepare_sample(folder)
    return str(train), str(val)


def reusable(output_dir: Path, source: DataSource, requested: Choice) -> PrepareReport | None:
    """The marker's report when ``output_dir`` already holds this source's data, made with the
    tokenizer asked for (``auto`` accepts gpt2 or bytes), and its files are intact; else None."""
    try:
        report = PrepareReport.model_validate_json((output_dir / PREPARED_MARKER).read_text())
        read_header(output_dir / TRAIN_FILE)
        if report.val_tokens:
            read_header(output_dir / VAL_FILE)
    except (OSError, ValueError):
        return None
    if report.source != source.describe() or not accepts(requested, report.tokenizer):
        return None
    return report.model_copy(update={"reused": True})


def prepare_source(
    source: DataSource,
    output_dir: Path,
    requested: Choice = "auto",
    val_fraction: float = 0.05,
    claim_mount: Path | None = None,
) -> PrepareReport:
    """Prepare ``source`` into ``output_dir`` once: a folder that already holds it (the
    marker) is left as it is. Raises SourceError, TokenizerUnavailable or ValueError."""
    found = reusable(output_dir, source, requested)
    if found is not None:
        return found
    tokenizer = choose(requested)
    result = prepare_data(
        sources.documents(source, claim_mount), output_dir, val_fraction, tokenizer
    )
    report = PrepareReport(
        source=source.describe(),
        tokenizer=tokenizer.name,
        tokenizer_note=tokenizer.note,
        documents=result.documents,
        train_tokens=result.train.num_tokens,
        val_tokens=result.val.num_tokens if result.val else 0,
        vocab_size=tokenizer.vocab_size,
    )
    marker = output_dir / PREPARED_MARKER
    partial = marker.with_name(f".{PREPARED_MARKER}.tmp")
    partial.write_text(report.model_dump_json(by_alias=True, exclude_none=True))
    partial.replace(marker)  # last: a folder with the marker is complete
    return report
