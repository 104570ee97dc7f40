"""The safetensors format, written and read with torch alone, checked against the format's
published layout byte by byte (the ``safetensors`` package is not a dependency)."""

import json
import struct
from pathlib import Path

import torch

from torchkube.trainer.hf import read_header
from torchkube.trainer.safetensors import MappedFile, save_file


def sample_tensors() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {
        "odd.bytes": torch.randint(0, 255, (3,), dtype=torch.uint8),  # later data unaligned
        "model.layers.0.weight": torch.randn(5, 3),
        "bf16": torch.randn(2, 7).to(torch.bfloat16),
        "half": torch.randn(4).half(),
        "ids": torch.arange(6, dtype=torch.int64).view(2, 3),
        "mask": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
        "transposed": torch.randn(3, 4).t(),  # not contiguous
    }


def test_files_follow_the_published_layout(tmp_path: Path) -> None:
    tensors = sample_tensors()
    path = tmp_path / "model.safetensors"
    save_file(tensors, path, {"format": "pt"})
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    assert (8 + length) % 8 == 0  # the data starts 8-byte aligned
    header = json.loads(raw[8 : 8 + length])
    assert header.pop("__metadata__") == {"format": "pt"}
    data = raw[8 + length :]
    names = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
    names |= {"I64": torch.int64, "U8": torch.uint8, "BOOL": torch.bool}
    end = 0
    for name, info in header.items():
        begin, stop = info["data_offsets"]
        assert begin == end  # packed in order, no gaps
        end = stop
        tensor = tensors[name]
        assert info["shape"] == list(tensor.shape) and names[info["dtype"]] == tensor.dtype
        expected = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        assert data[begin:stop] == expected, name
    assert end == len(data)


def test_mapped_tensors_read_back_exactly(tmp_path: Path) -> None:
    tensors = sample_tensors()
    path = tmp_path / "model.safetensors"
    save_file(tensors, path)
    mapped = MappedFile(path)
    entries = read_header(path)
    assert list(entries) == list(tensors)
    for name, tensor in tensors.items():
        read = mapped.tensor(entries[name])
        assert read.dtype == tensor.dtype and torch.equal(read, tensor), name
    # a slice of a mapped tensor is what a rank copies out of it
    assert torch.equal(
        mapped.tensor(entries["model.layers.0.weight"])[1:3], tensors["model.layers.0.weight"][1:3]
    )
