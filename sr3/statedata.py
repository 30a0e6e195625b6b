"""Deterministic state-like data for the demo, tests and benchmarks.

Operator state is mostly rows of keys, counters, timestamps and short strings: it
compresses, but not absurdly. The generator builds a pool of such rows from a seed, then
emits blocks cut from the pool at seeded offsets, each stamped with its block number so
that no two blocks (and so no two chunks) are identical, whatever the chunk size.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Iterator
from pathlib import Path

__all__ = ["BLOCK_BYTES", "state_blocks", "state_bytes", "write_state_file"]

BLOCK_BYTES = 64 * 1024
POOL_BYTES = 8 * 1024 * 1024
_ROW = struct.Struct("<qqqd16s")
_WORDS = [f"{word:<16}".encode()[:16] for word in (
    "click", "view", "purchase", "session", "cart", "search", "login", "logout",
    "scroll", "share", "like", "comment", "signup", "refund", "checkout", "error",
)]  # fmt: skip


def _pool(seed: int) -> bytes:
    rng = random.Random(seed)
    rows = []
    timestamp = 1_700_000_000_000
    for _ in range(POOL_BYTES // _ROW.size + 1):
        timestamp += rng.randrange(0, 2000)
        rows.append(
            _ROW.pack(
                rng.randrange(1_000_000),
                rng.randrange(1, 500),
                timestamp,
                rng.random() * 1000.0,
                _WORDS[rng.randrange(len(_WORDS))],
            )
        )
    return b"".join(rows)[:POOL_BYTES]


def state_blocks(total_bytes: int, seed: int) -> Iterator[bytes]:
    """Yield ``total_bytes`` of state-like bytes in blocks of at most ``BLOCK_BYTES``."""
    pool = _pool(seed)
    rng = random.Random(seed ^ 0x5EED)
    emitted = 0
    block_number = 0
    while emitted < total_bytes:
        size = min(BLOCK_BYTES, total_bytes - emitted)
        offset = rng.randrange(0, POOL_BYTES - BLOCK_BYTES)
        stamp = struct.pack("<QQ", seed, block_number)
        yield (stamp + pool[offset : offset + BLOCK_BYTES - len(stamp)])[:size]
        emitted += size
        block_number += 1


def state_bytes(total_bytes: int, seed: int) -> bytes:
    return b"".join(state_blocks(total_bytes, seed))


def write_state_file(path: Path, total_bytes: int, seed: int) -> None:
    with open(path, "wb") as handle:
        for block in state_blocks(total_bytes, seed):
            handle.write(block)
