"""The token file format and the byte-level tokenizer; no torch, so preflight checks and
``torchkube prepare-data`` stay light.

The format is llm.c's (``dev/data/data_common.py``), so shards prepared with llm.c load
unchanged: a header of 256 little-endian int32 — magic, version, token count — followed by the
tokens, little-endian: uint16 for GPT-2-sized vocabularies (magic 20240520, version 1), uint32
for larger ones such as Llama 3's (magic 20240801, version 7). torchkube also stores the
vocabulary size in header slot 3; llm.c leaves it 0, which reads as GPT-2's 50,257 or Llama
3's 128,256.
"""

import glob
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
GPT2_VOCAB_SIZE = 50257
LLAMA3_VOCAB_SIZE = 128256
WIDE_MAGIC, WIDE_VERSION = 20240801, 7  # llm.c's Llama 3 files
# (magic, version) → token dtype, and the vocabulary a header without one means
FORMATS = {
    (MAGIC, VERSION): ("<u2", GPT2_VOCAB_SIZE),
    (WIDE_MAGIC, WIDE_VERSION): ("<u4", LLAMA3_VOCAB_SIZE),
}

# Byte-level tokenizer: one token per UTF-8 byte, plus an end-of-text token between documents.
EOT = 256
BYTE_VOCAB_SIZE = 257


@dataclass(frozen=True)
class TokenFileInfo:
    """What the header of one token file says."""

    path: Path
    num_tokens: int
    vocab_size: int
    dtype: str = "<u2"  # of the tokens: uint16, or uint32 for large vocabularies


def encode_bytes(text: str) -> np.ndarray:
    """Byte-level encoding: the UTF-8 bytes of ``text`` as uint16 tokens."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)


def decode_bytes(tokens: "np.ndarray | list[int]") -> str:
    """Inverse of :func:`encode_bytes`; end-of-text tokens become newlines."""
    data = bytes(10 if t == EOT else int(t) for t in tokens)
    return data.decode("utf-8", errors="replace")


def token_dtype(vocab_size: int) -> str:
    """The tokens' type in a file for this vocabulary: uint16 while every id fits, else uint32;
    tokenizers produce their ids in it, so a large vocabulary is never cut to 16 bits."""
    return "<u2" if vocab_size <= 1 << 16 else "<u4"


def write_token_file(path: Path, tokens: np.ndarray, vocab_size: int) -> TokenFileInfo:
    """Write ``tokens`` atomically (temp file + rename) so a reader never sees half a file;
    as uint16 when the vocabulary fits, else as uint32."""
    if tokens.size and int(tokens.max()) >= vocab_size:
        raise ValueError(f"token {int(tokens.max())} is outside the vocabulary ({vocab_size})")
    dtype = token_dtype(vocab_size)
    magic, version = (MAGIC, VERSION) if dtype == "<u2" else (WIDE_MAGIC, WIDE_VERSION)
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:4] = (magic, version, tokens.size, vocab_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype(dtype, copy=False).tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return TokenFileInfo(path, int(tokens.size), vocab_size, dtype)


def read_header(path: Path) -> TokenFileInfo:
    """Validate a token file's header and size; ValueError says what is wrong with it."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw = f.read(HEADER_BYTES)
    except OSError as e:
        raise ValueError(f"cannot read token file {path}: {e.strerror or e}") from e
    if len(raw) < HEADER_BYTES:
        raise ValueError(f"{path} is not a token file: shorter than its {HEADER_BYTES}-byte header")
    header = np.frombuffer(raw, dtype="<i4")
    known = FORMATS.get((int(header[0]), int(header[1])))
    if known is None:
        raise ValueError(
            f"{path} is not a token file (magic {header[0]}, version {header[1]}; expected "
            f"{MAGIC}, {VERSION} or {WIDE_MAGIC}, {WIDE_VERSION}); make one with "
            "`torchkube prepare-data`"
        )
    dtype, default_vocab = known
    width = np.dtype(dtype).itemsize
    num_tokens = int(header[2])
    if size != HEADER_BYTES + width * num_tokens:
        raise ValueError(
            f"{path} is truncated or padded: header says {num_tokens} tokens, "
            f"file holds {(size - HEADER_BYTES) // width}"
        )
    return TokenFileInfo(path, num_tokens, int(header[3]) or default_vocab, dtype)


def resolve_token_files(pattern: str) -> list[Path]:
    """The files behind a ``dataPath``: one file, or the sorted matches of a glob pattern."""
    if glob.has_magic(pattern):
        paths = [Path(p) for p in sorted(glob.glob(pattern))]
        if not paths:
            raise ValueError(f"no token files match {pattern}")
        return paths
    path = Path(pattern)
    if not path.is_file():
        raise ValueError(f"token file {pattern} does not exist")
    return [path]
