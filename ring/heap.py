"""Keep a process's chunk-sized buffers for reuse instead of mapping fresh pages for each.

Every chunk a peer takes or serves passes through buffers of a few MiB: the body as it
arrives, the file's bytes as they are read. glibc's malloc maps an allocation above its
mmap threshold (128 KiB at first, raised up to 32 MiB only as such maps are freed) with
a map of its own and unmaps it when freed, and gives the top of a heap back to the
kernel once more than its trim threshold is free there. Either way the next chunk's
buffer is fresh memory: a page fault and a zeroed page every 4 KiB, on every replica.
``keep_buffers`` raises both thresholds, so chunk-sized buffers come from the heap and
freed ones are reused; the memory a process keeps is bounded by what it held at once
(its concurrent transfers) plus ``TRIM_THRESHOLD_BYTES`` per malloc arena.
"""

from __future__ import annotations

import ctypes
import logging
import sys

from ring.codec import STORED_BYTES_MAX

__all__ = ["MMAP_THRESHOLD_BYTES", "TRIM_THRESHOLD_BYTES", "keep_buffers"]

log = logging.getLogger(__name__)

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Above the largest stored chunk, so that every chunk buffer comes from a heap; glibc
# takes at most 32 MiB here on 64-bit machines.
MMAP_THRESHOLD_BYTES = 16 * 1024 * 1024
# Free memory at the top of a heap kept for reuse before it goes back to the kernel.
TRIM_THRESHOLD_BYTES = 64 * 1024 * 1024
assert STORED_BYTES_MAX < MMAP_THRESHOLD_BYTES < TRIM_THRESHOLD_BYTES


def keep_buffers() -> bool:
    """Set the thresholds (glibc only); whether they took effect. A process-wide
    setting: sr3's own processes call it, a library never does."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1)
    done = bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1) and done
    if not done:
        log.info("malloc thresholds not set (not glibc): chunk buffers are fresh pages")
    return done
