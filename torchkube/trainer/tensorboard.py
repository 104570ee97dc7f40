"""TensorBoard scalars, written with the standard library alone (no tensorboard package in the
trainer image): ``tensorboard --logdir`` on the checkpoint claim reads them.

The format is TensorFlow's event file, ``events.out.tfevents.<time>.<host>.<pid>.<n>``: a sequence
of TFRecords, each a little-endian uint64 length, the masked CRC-32C of those 8 bytes, the
record, and the masked CRC-32C of the record. Each record is a serialised ``Event`` protocol
buffer (tensorflow/core/util/event.proto): ``wall_time`` (field 1, double), ``step`` (2, int64),
and either ``file_version`` (3, string; the first record), ``summary`` (5), whose repeated
``value`` (1) holds a ``tag`` (1, string) and a ``simple_value`` (2, float), or ``session_log``
(7) marking a resume. The encoder below writes just those fields.
"""

import itertools
import os
import socket
import struct
import time
from collections.abc import Mapping
from pathlib import Path

FOLDER = "tensorboard"  # under the checkpoint folder: `tensorboard --logdir` on the claim
FILE_VERSION = "brain.Event:2"
_CRC32C_POLY = 0x82F63B78  # Castagnoli, reflected


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ _CRC32C_POLY if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    """TFRecord's checksum: the CRC rotated and offset, so CRCs of CRCs stay strong."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, wire_type: int) -> bytes:
    return _varint(number << 3 | wire_type)


def _bytes_field(number: int, payload: bytes) -> bytes:
    return _field(number, 2) + _varint(len(payload)) + payload


def _event(wall_time: float, step: int, body: bytes) -> bytes:
    return _field(1, 1) + struct.pack("<d", wall_time) + _field(2, 0) + _varint(step) + body


def scalar_event(wall_time: float, step: int, scalars: Mapping[str, float]) -> bytes:
    """An ``Event`` with a ``Summary`` of one ``simple_value`` per tag."""
    values = b"".join(
        _bytes_field(1, _bytes_field(1, tag.encode()) + _field(2, 5) + struct.pack("<f", value))
        for tag, value in scalars.items()
    )
    return _event(wall_time, step, _bytes_field(5, values))


def session_start_event(wall_time: float, step: int) -> bytes:
    """An ``Event`` whose ``session_log`` (7) has ``status`` (1) START (1): TensorBoard drops
    every earlier event at ``step`` or later, what a run wrote past the checkpoint it
    crashed after and resumed from (computed again, and logged again, by the resumed run)."""
    return _event(wall_time, step, _bytes_field(7, _field(1, 0) + _varint(1)))


def record(data: bytes) -> bytes:
    """One TFRecord."""
    length = struct.pack("<Q", len(data))
    return (
        length + struct.pack("<I", masked_crc(length)) + data + struct.pack("<I", masked_crc(data))
    )


_STARTS = itertools.count(1)
"""Writers started in this process: two runs of one process (a local runner, a test) in the
same second would otherwise share a file name and the second would append to the first's."""


class EventWriter:
    """Scalars into a new event file under ``folder``; one file per process start, so a
    resumed run adds a file beside the earlier ones and TensorBoard shows them as one run."""

    def __init__(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        now = time.time()
        host, pid, start = socket.gethostname(), os.getpid(), next(_STARTS)
        name = f"events.out.tfevents.{int(now)}.{host}.{pid}.{start}"
        self.path = folder / name
        self._file = open(self.path, "ab")  # noqa: SIM115 (open for the writer's life)
        self._write(record(_event(now, 0, _bytes_field(3, FILE_VERSION.encode()))))

    def resumed(self, step: int) -> None:
        """Training goes on after ``step`` (a checkpoint's): whatever an earlier run logged for
        later steps is orphaned."""
        self._write(record(session_start_event(time.time(), step + 1)))

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        """Write ``values`` (tag → number) at ``step``, flushed at once: a pod can be killed
        at any moment, and TensorBoard reads the file while it grows."""
        self._write(record(scalar_event(time.time(), step, values)))

    def _write(self, data: bytes) -> None:
        self._file.write(data)
        self._file.flush()

    def close(self) -> None:
        self._file.close()
