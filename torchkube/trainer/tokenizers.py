"""The tokenizers ``torchkube prepare-data`` writes token files with: GPT-2's BPE where its
vocabulary is available, bytes everywhere, or the Hugging Face tokenizer of a weights folder.

GPT-2 BPE comes from ``tiktoken`` (the ``data`` extra), whose vocabulary is a download on first
use (cached under ``TIKTOKEN_CACHE_DIR``): a cluster without internet, or an image without
tiktoken, has bytes only. ``auto`` takes GPT-2 when it loads and says why not otherwise, so the
job's status tells which one the model was trained on.

A folder (``prepare-data --tokenizer DIR``) is for a model that starts from published weights
(``trainer.weightsPath``): its data must be tokenised with the weights' own ``tokenizer.json``,
which the trainer checks at start-up. Its ids may exceed uint16 (Llama 3's 128,256 tokens), so
every tokenizer encodes into the token type its vocabulary needs in a file
(:func:`torchkube.trainer.tokens.token_dtype`).
"""

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from torchkube.api.data import Tokenizer as Requested
from torchkube.trainer import hf
from torchkube.trainer.tokens import BYTE_VOCAB_SIZE, EOT, encode_bytes, token_dtype

Choice = Requested | Path
"""What prepare-data tokenises with: one of spec.data's names, or a Hugging Face folder."""


class TokenizerUnavailable(RuntimeError):
    """The tokenizer asked for cannot be loaded here; the message says why and what to do."""


@dataclass(frozen=True)
class Tokenizer:
    """Text to token ids, and the id that ends each document."""

    name: str
    vocab_size: int
    eot: int
    encode: Callable[[str], np.ndarray]
    """Ids in the token type of the vocabulary's files (``token_dtype(vocab_size)``)."""
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


def hugging_face(folder: Path) -> Tokenizer:
    """The tokenizer of a Hugging Face folder: its ``tokenizer.json`` through the
    ``tokenizers`` package (which torchkube does not depend on), the text encoded without
    special tokens around it and each document ended by the folder's end-of-sequence token.
    Named by the folder's absolute path, so a second run with the same folder reuses its data.
    TokenizerUnavailable without the package; ValueError for a folder without a usable
    tokenizer."""
    vocab_size = hf.tokenizer_vocab_size(folder)
    if vocab_size is None:
        raise ValueError(f"{folder} has no {hf.TOKENIZER_FILE}")
    try:
        import tokenizers
    except ImportError as error:
        raise TokenizerUnavailable(
            f"--tokenizer {folder} needs the tokenizers package: pip install tokenizers ({error})"
        ) from error
    try:
        tokenizer = tokenizers.Tokenizer.from_file(str(folder / hf.TOKENIZER_FILE))
    except Exception as error:  # the package's Rust core raises plain Exception
        raise ValueError(f"{folder / hf.TOKENIZER_FILE} does not load: {error}") from error
    eos = _end_of_sequence(folder)
    eot = tokenizer.token_to_id(eos) if isinstance(eos, str) else eos
    if eot is None:
        raise ValueError(f"the tokenizer in {folder} has no token {eos!r}")
    dtype = token_dtype(vocab_size)

    def encode(text: str) -> np.ndarray:
        return np.asarray(tokenizer.encode(text, add_special_tokens=False).ids, dtype=dtype)

    return Tokenizer(_folder_name(folder), vocab_size, eot, encode)


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


def _folder_name(folder: Path) -> str:
    return str(folder.resolve())


def choose(requested: Choice) -> Tokenizer:
    """The tokenizer for ``requested``: a folder's, ``gpt2`` or fail, ``bytes``, or ``auto``
    (GPT-2 if it loads, else bytes with the reason in ``note``)."""
    if isinstance(requested, Path):
        return hugging_face(requested)
    if requested == "bytes":
        return BYTES
    if requested == "gpt2":
        return gpt2()
    try:
        return gpt2()
    except TokenizerUnavailable as why:
        return Tokenizer(BYTES.name, BYTES.vocab_size, BYTES.eot, BYTES.encode, f"bytes: {why}")


def accepts(requested: Choice, made_with: str) -> bool:
    """Whether data tokenised by the tokenizer named ``made_with`` is what ``requested`` asks
    for: ``auto`` takes either tokenizer it may pick, anything else only itself."""
    if isinstance(requested, Path):
        return made_with == _folder_name(requested)
    return made_with in (("gpt2", "bytes") if requested == "auto" else (requested,))
