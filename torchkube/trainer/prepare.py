"""``torchkube prepare-data``: text files → token files, offline, before a job starts.

Tokenisation happens here and never inside the pods, so training reads a memory-mapped file
from the volume and needs no network and no tokenizer. The default tokenizer is byte-level
(vocab 257, see :mod:`torchkube.trainer.tokens`): nothing to download, works for any language,
and is plenty for the quick start and the tests. ``--tokenizer DIR`` uses the Hugging Face
tokenizer of a weights folder instead (``tokenizer.json``, through the ``tokenizers``
package), for a model that starts from those weights. For GPT-2 BPE data, write llm.c-format
shards with llm.c's own scripts; the trainer reads them as they are.
"""

import json
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from torchkube.trainer import corpus, hf
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


@dataclass(frozen=True)
class Encoder:
    """A tokenizer as far as token files need one: text → ids, the id that ends a document,
    and the vocabulary size the files record."""

    encode: Callable[[str], Sequence[int] | np.ndarray]
    end_of_text: int
    vocab_size: int


BYTE_ENCODER = Encoder(encode_bytes, EOT, BYTE_VOCAB_SIZE)


def hf_encoder(folder: Path) -> Encoder:
    """The Hugging Face tokenizer of a weights folder, without special tokens around the
    text; each document ends with its end-of-sequence token. Needs the ``tokenizers``
    package, which torchkube itself does not depend on."""
    try:
        import tokenizers
    except ImportError as e:
        raise ValueError(
            f"--tokenizer needs the tokenizers package: pip install tokenizers ({e})"
        ) from e
    vocab_size = hf.tokenizer_vocab_size(folder)
    if vocab_size is None:
        raise ValueError(f"{folder} has no {hf.TOKENIZER_FILE}")
    tokenizer = tokenizers.Tokenizer.from_file(str(folder / hf.TOKENIZER_FILE))
    eos = _end_of_sequence(folder)
    end = tokenizer.token_to_id(eos) if isinstance(eos, str) else eos
    if end is None:
        raise ValueError(f"the tokenizer in {folder} has no token {eos!r}")
    return Encoder(
        lambda text: tokenizer.encode(text, add_special_tokens=False).ids, end, vocab_size
    )


def _end_of_sequence(folder: Path) -> str | int:
    """The end-of-sequence token: tokenizer_config.json's ``eos_token``, else config.json's
    ``eos_token_id`` (the first, when it lists several)."""
    for name, key in (("tokenizer_config.json", "eos_token"), (hf.CONFIG_FILE, "eos_token_id")):
        path = folder / name
        if not path.is_file():
            continue
        try:
            value = json.loads(path.read_text()).get(key)
        except (OSError, ValueError, AttributeError) as e:
            raise ValueError(f"cannot read {path}: {e}") from e
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, list):
            value = value[0] if value else None
        if isinstance(value, str | int):
            return value
    raise ValueError(f"{folder} names no end-of-sequence token (eos_token, eos_token_id)")


def tokenize_documents(
    documents: Iterable[str], encoder: Encoder = BYTE_ENCODER
) -> tuple[np.ndarray, int]:
    """All documents as one token stream, each followed by an end-of-text token."""
    dtype = np.uint16 if encoder.vocab_size <= 1 << 16 else np.uint32
    parts: list[np.ndarray] = []
    eot = np.array([encoder.end_of_text], dtype=dtype)
    count = 0
    for doc in documents:
        parts += [np.asarray(encoder.encode(doc), dtype=dtype), eot]
        count += 1
    return (np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)), count


def prepare_data(
    documents: Iterable[str],
    output_dir: Path,
    val_fraction: float = 0.05,
    encoder: Encoder = BYTE_ENCODER,
) -> PrepareResult:
    """Tokenise ``documents`` into ``train.bin`` and (when ``val_fraction`` > 0) ``val.bin``.

    The validation split is the tail of the token stream: deterministic, and no document
    order is assumed beyond the one given.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val fraction must be in [0, 1), got {val_fraction}")
    tokens, count = tokenize_documents(documents, encoder)
    if tokens.size < 2:
        raise ValueError("no text to tokenise: the inputs are empty")
    n_val = int(tokens.size * val_fraction)
    vocab = encoder.vocab_size
    train = write_token_file(output_dir / "train.bin", tokens[: tokens.size - n_val], vocab)
    val = write_token_file(output_dir / "val.bin", tokens[-n_val:], vocab) if n_val else None
    return PrepareResult(train, val, count)


def prepare_text_files(
    inputs: Iterable[Path],
    output_dir: Path,
    val_fraction: float,
    encoder: Encoder = BYTE_ENCODER,
) -> PrepareResult:
    """:func:`prepare_data` over text files: each file is one document."""
    docs = (p.read_text(encoding="utf-8", errors="replace") for p in iter_text_files(inputs))
    return prepare_data(docs, output_dir, val_fraction, encoder)


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
