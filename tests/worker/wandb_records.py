"""Read an offline W&B run file (`run-<id>.wandb`) back, for the tests: wandb ships the protocol
buffers (wandb.proto.wandb_internal_pb2) but no reader in Python any more.

The file is a header (`:W&B`, a 2-byte magic, a 1-byte version), then LevelDB-style log blocks
of 32 KiB: records of `crc32 (4) | length (2, little-endian) | type (1) | data`, where type 1 is a
whole record and 2/3/4 the first/middle/last piece of one split across blocks; a block's tail too
short for a record header is zero padding.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

HEADER = 7
BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[Any]:
    """Every record of the file as a wandb_internal_pb2.Record."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    out, pieces, pos = [], b"", HEADER
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # the block's padding
            pos += BLOCK - pos % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:  # zeros: the end of what was written
            break
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        pieces = chunk if kind in (FULL, FIRST) else pieces + chunk
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(pieces)
            out.append(record)
    return out


def history(path: Path) -> list[dict[str, Any]]:
    """The run's logged rows ({key: value, "_step": step}), in order."""
    rows = []
    for r in records(path):
        if r.WhichOneof("record_type") == "history":
            rows.append(
                {
                    item.key or ".".join(item.nested_key): json.loads(item.value_json)
                    for item in r.history.item
                }
            )
    return rows


def run_record(path: Path) -> Any:
    """The run's RunRecord (project, entity, display name, tags, config)."""
    for r in records(path):
        if r.WhichOneof("record_type") == "run":
            return r.run
    raise AssertionError(f"{path} holds no run record")
