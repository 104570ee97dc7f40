"""The tokenizers ``torchkube prepare-data`` writes token files with: GPT-2's BPE where its
vocabulary is available, bytes everywhere.

GPT-2 BPE comes from ``tiktoken`` (the ``data`` extra), whose vocabulary is a download on first
use (cached under ``TIKTOKEN_CACHE_DIR``): a cluster without internet, or an image without
tiktoken, has bytes only. ``auto`` takes GPT-2 when it loads and says why not otherwise, so the
job's status tells which one the model was trained on.
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from torchkube.api.data import Tokenizer as Requested
from torchkube.trainer.tokens import BYTE_VOCAB_SIZE, EOT, encode_bytes


class TokenizerUnavailable(RuntimeError):
    """GPT-2 BPE was asked for and cannot be loaded here; the message says why and what to do."""


@dataclass(frozen=True)
class Tokenizer:
    """Text to token ids, and the id that ends each document."""

    name: str
    vocab_size: int
    eot: int
    encode: Callable[[str], np.ndarray]
    note: str | None = None
    """Why this is not the tokenizer that was asked for (``auto`` fell back to bytes)."""


BYTES = Tokenizer("bytes", BYTE_VOCAB_SIZE, EOT, encode_bytes)


def gpt2() -> Tokenizer:
    """GPT-2's BPE through tiktoken; TokenizerUnavailable when tiktoken or its vocabulary is
    missing (the vocabulary is downloaded once, then read from tiktoken's cache)."""
    try:
        import tiktoken
    except ImportError as error:
        raise TokenizerUnavailable(
            "tiktoken is not installed (pip install 'torchkube[data]', or use tokenizer: bytes)"
        ) from error
    try:
        encoding = tiktoken.get_encoding("gpt2")
    except Exception as error:  # tiktoken raises whatever its download raised
        raise TokenizerUnavailable(
            f"GPT-2's vocabulary could not be loaded ({type(error).__name__}: {error}); it is "
            "downloaded on first use, so this needs internet access or a filled "
            "TIKTOKEN_CACHE_DIR (or use tokenizer: bytes)"
        ) from error

    def encode(text: str) -> np.ndarray:
        return np.asarray(encoding.encode_ordinary(text), dtype=np.uint16)

    return Tokenizer("gpt2", encoding.n_vocab, encoding.eot_token, encode)


def choose(requested: Requested) -> Tokenizer:
    """The tokenizer for ``requested``: ``gpt2`` or fail, ``bytes``, or ``auto`` (GPT-2 if it
    loads, else bytes with the reason in ``note``)."""
    if requested == "bytes":
        return BYTES
    if requested == "gpt2":
        return gpt2()
    try:
        return gpt2()
    except TokenizerUnavailable as why:
        return Tokenizer(BYTES.name, BYTES.vocab_size, BYTES.eot, BYTES.encode, f"bytes: {why}")
