"""``torchkube prepare-data``: text files → token files, offline, before a job starts.

Tokenisation happens here and never inside the pods, so training reads a memory-mapped file
from the volume and needs no network and no tokenizer. The tokenizer is byte-level (vocab 257,
see :mod:`torchkube.trainer.tokens`): nothing to download, works for any language, and is
plenty for the quick start and the tests. For GPT-2 BPE data, write llm.c-format shards with
llm.c's own scripts; the trainer reads them as they are.
"""

import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from torchkube.trainer import corpus
from torchkube.trainer.tokens import (
    BYTE_VOCAB_SIZE,
    EOT,
    TokenFileInfo,
    encode_bytes,
    read_header,
    write_token_file,
)

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".text")
SAMPLE_VERSION = 1  # bump when the generated corpus changes, so stale caches are not reused


@dataclass(frozen=True)
class PrepareResult:
    """The files written and what they hold."""

    train: TokenFileInfo
    val: TokenFileInfo | None
    documents: int


def iter_text_files(inputs: Iterable[Path]) -> Iterator[Path]:
    """Each input file, or the text files under each input folder in sorted order."""
    for path in inputs:
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*") if p.suffix in TEXT_SUFFIXES)
        elif path.is_file():
            yield path
        else:
            raise FileNotFoundError(f"input {path} does not exist")


def tokenize_documents(documents: Iterable[str]) -> tuple[np.ndarray, int]:
    """All documents as one token stream, each followed by an end-of-text token."""
    parts: list[np.ndarray] = []
    eot = np.array([EOT], dtype=np.uint16)
    count = 0
    for doc in documents:
        parts += [encode_bytes(doc), eot]
        count += 1
    return (np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)), count


def prepare_data(
    documents: Iterable[str], output_dir: Path, val_fraction: float = 0.05
) -> PrepareResult:
    """Tokenise ``documents`` into ``train.bin`` and (when ``val_fraction`` > 0) ``val.bin``.

    The validation split is the tail of the token stream: deterministic, and no document
    order is assumed beyond the one given.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val fraction must be in [0, 1), got {val_fraction}")
    tokens, count = tokenize_documents(documents)
    if tokens.size < 2:
        raise ValueError("no text to tokenise: the inputs are empty")
    n_val = int(tokens.size * val_fraction)
    train = write_token_file(
        output_dir / "train.bin", tokens[: tokens.size - n_val], BYTE_VOCAB_SIZE
    )
    val = (
        write_token_file(output_dir / "val.bin", tokens[-n_val:], BYTE_VOCAB_SIZE)
        if n_val
        else None
    )
    return PrepareResult(train, val, count)


def prepare_text_files(
    inputs: Iterable[Path], output_dir: Path, val_fraction: float
) -> PrepareResult:
    """:func:`prepare_data` over text files: each file is one document."""
    docs = (p.read_text(encoding="utf-8", errors="replace") for p in iter_text_files(inputs))
    return prepare_data(docs, output_dir, val_fraction)


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
