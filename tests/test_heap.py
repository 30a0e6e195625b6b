"""A process that keeps its chunk buffers (``ring.heap``) reuses freed chunk-sized memory
instead of faulting in fresh pages for every chunk.

Each case runs in a process of its own: the malloc thresholds are process-wide.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from ring.heap import keep_buffers

# What a peer holds at once while it takes chunks, freed together, forty times over: raw
# chunks (4 MiB), bodies (1.5 and 3 MB), socket reads (256 KiB), then a few more bodies.
# Prints the minor page faults of the loop.
_SIZES = [4 * 1024 * 1024, 3_000_000, 1_500_000, 256 * 1024] * 2
_BODIES = [1_500_000] * 3
_PAGES_PER_ROUND = sum(_SIZES + _BODIES) // 4096
_ROUNDS = f"""
import resource, sys
from ring.heap import keep_buffers
if sys.argv[1] == "keep":
    assert keep_buffers()
def touch(buffer):
    buffer[::4096] = b"x" * len(range(0, len(buffer), 4096))
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(40):
    for sizes in ({_SIZES!r}, {_BODIES!r}):
        held = [bytearray(size) for size in sizes]
        for buffer in held:
            touch(buffer)
        del held
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", _ROUNDS, mode],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc only")
def test_kept_buffers_are_reused_not_faulted_in_again() -> None:
    """Breaks without the thresholds: glibc maps some of each round's buffers afresh
    or gives the freed memory back to the kernel, and most rounds fault their pages in
    again (about 28 of 40 rounds' worth here). Must hold: with them, the first round's
    pages serve every later round."""
    kept, fresh = _faults("keep"), _faults("fresh")
    assert fresh > 10 * _PAGES_PER_ROUND, fresh
    assert kept < 3 * _PAGES_PER_ROUND, kept


def test_keep_buffers_says_whether_it_took_effect() -> None:
    assert keep_buffers() is sys.platform.startswith("linux")
