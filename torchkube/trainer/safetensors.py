"""Tensors in and out of safetensors files, with torch alone (no ``safetensors`` package).

Reading maps the file into memory (a private, copy-on-write mapping) and returns views of it:
nothing is read from disk until a slice of a tensor is touched, so a rank that needs one
shard of a weight reads that shard's pages only. The header is parsed by ``hf.read_header``,
where the format is described.
"""

import json
import math
import mmap
import os
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from torchkube.trainer.hf import HEADER_LENGTH_BYTES, METADATA_KEY, TensorEntry

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
NAMES = {dtype: name for name, dtype in DTYPES.items()}
ALIGNMENT = 8  # the header is padded so the data starts 8-byte aligned


class MappedFile:
    """One safetensors file, memory-mapped; :meth:`tensor` gives views into it."""

    def __init__(self, path: Path):
        self.path = path
        fd = os.open(path, os.O_RDONLY)
        try:
            self._map = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)
        finally:
            os.close(fd)

    def tensor(self, entry: TensorEntry) -> torch.Tensor:
        """The tensor ``entry`` describes, as a view of the mapping (no bytes read yet)."""
        dtype = DTYPES[entry.dtype]
        numel = (entry.end - entry.start) // dtype.itemsize
        if numel == 0:
            return torch.empty(entry.shape, dtype=dtype)
        flat = torch.frombuffer(self._map, dtype=dtype, count=numel, offset=entry.start)
        return flat.view(entry.shape)


@dataclass(frozen=True)
class TensorSpec:
    """What a tensor will be, before it exists: enough to write its file's header."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def save_file(
    tensors: Mapping[str, torch.Tensor], path: Path, metadata: Mapping[str, str] | None = None
) -> None:
    """Write ``tensors`` (any device, any layout) as one safetensors file, atomically."""
    specs = [TensorSpec(name, t.dtype, tuple(t.shape)) for name, t in tensors.items()]
    write_streamed(path, specs, tensors.__getitem__, metadata)


def write_streamed(
    path: Path,
    specs: Sequence[TensorSpec],
    produce: Callable[[str], torch.Tensor],
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write one safetensors file, atomically, asking ``produce`` for each tensor only when
    its bytes are due: the header is made from ``specs`` first, so a file of many tensors
    never needs more than one of them in memory (an export of a large checkpoint)."""
    header: dict[str, object] = {METADATA_KEY: dict(metadata or {"format": "pt"})}
    offset = 0
    for spec in specs:
        header[spec.name] = {
            "dtype": NAMES[spec.dtype],
            "shape": list(spec.shape),
            "data_offsets": [offset, offset + spec.nbytes],
        }
        offset += spec.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(HEADER_LENGTH_BYTES + len(raw)) % ALIGNMENT)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for spec in specs:
            tensor = produce(spec.name)
            if tensor.dtype != spec.dtype or tuple(tensor.shape) != spec.shape:
                raise ValueError(
                    f"{spec.name} is {tensor.dtype} {list(tensor.shape)}, its header says "
                    f"{spec.dtype} {list(spec.shape)}"
                )
            data = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
            f.write(data.numpy().tobytes())
            del tensor, data
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
