"""Small file helpers shared by the peer, the client and the drills."""

from __future__ import annotations

import os
from pathlib import Path

import xxhash

__all__ = ["file_digest", "fsync_dir"]

READ_BYTES = 8 * 1024 * 1024


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_digest(path: Path) -> str:
    """xxh3-128 of a file's bytes, the digest blob references carry."""
    hasher = xxhash.xxh3_128()
    with open(path, "rb") as handle:
        while block := handle.read(READ_BYTES):
            hasher.update(block)
    return hasher.hexdigest()
