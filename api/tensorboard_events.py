"""A job's metrics as a TensorBoard event file, written here without TensorFlow, torch or the
`tensorboard` package (the API stays light): the file is a TFRecord stream of `Event` protocol
buffers, both simple enough to encode by hand.

- TFRecord: each record is `uint64 length`, `uint32 masked_crc32c(length bytes)`, the data,
  `uint32 masked_crc32c(data)`, little-endian; CRC-32C (Castagnoli), masked as TensorFlow does.
- Event (tensorflow/core/util/event.proto): wall_time = 1 (double), step = 2 (int64),
  file_version = 3 (string), summary = 5 (Summary); Summary: repeated value = 1; Summary.Value:
  tag = 1 (string), simple_value = 2 (float), which TensorBoard shows as a scalar.

The first event names the format (`brain.Event:2`); then one event per Metric row, holding that
step's scalars (SCALARS, the registry's TensorBoard tags: only the values the row has). tests/api/test_tensorboard.py reads the
result back with TensorBoard's own EventAccumulator.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Iterator
from typing import Protocol

from trainer.config.metrics import STORED

# (tag in TensorBoard, Metric column)
SCALARS = tuple((spec.tensorboard, spec.name) for spec in STORED if spec.tensorboard)
FILE_VERSION = b"brain.Event:2"


def _crc32c_table() -> tuple[int, ...]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1  # the reflected Castagnoli polynomial
        table.append(c)
    return tuple(table)


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    table = _TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def record(data: bytes) -> bytes:
    """One TFRecord holding `data`."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # int64 as protobuf sends it: a negative number as its two's complement
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2): strings and messages."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _scalar(tag: str, value: float) -> bytes:
    """A Summary.Value with a simple_value (field 2, wire type 5: a 32-bit float)."""
    return _field(1, tag.encode("utf-8")) + bytes([2 << 3 | 5]) + struct.pack("<f", value)


def event(wall_time: float, step: int | None = None, *, scalars: Iterable[tuple[str, float]] = ()) -> bytes:
    """An Event: wall_time (field 1, a 64-bit double), the step (field 2, a varint) and a Summary
    (field 5) of the scalars; without a step, the file_version event."""
    out = bytes([1 << 3 | 1]) + struct.pack("<d", wall_time)
    if step is None:
        return out + _field(3, FILE_VERSION)
    out += bytes([2 << 3 | 0]) + _varint(step)
    summary = b"".join(_field(1, _scalar(tag, value)) for tag, value in scalars)
    return out + _field(5, summary)


class MetricLike(Protocol):
    """A Metric row (core.models.Metric): its step, and its values as attributes named by SCALARS."""

    step: int


def step_scalars(row: MetricLike) -> list[tuple[str, float]]:
    """The row's values as (tag, value); absent and non-finite values are left out."""
    out = []
    for tag, column in SCALARS:
        value = getattr(row, column, None)
        if value is not None and math.isfinite(value):
            out.append((tag, float(value)))
    return out


def event_records(rows: Iterable[tuple[MetricLike, float]], start_time: float) -> Iterator[bytes]:
    """The event file's records: the version, then one per (row, its wall time) with any value."""
    yield record(event(start_time))
    for row, wall_time in rows:
        scalars = step_scalars(row)
        if scalars:
            yield record(event(wall_time, row.step, scalars=scalars))
