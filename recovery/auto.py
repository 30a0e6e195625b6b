"""Choosing a topology for a recovery about to run: the cost model fed with what the
ring looks like now (holders, sizes), with the network as given or as measured from
the client's recent transfers, and with this machine's CPU rate as measured.

The CPU rate (``Network.node_bytes_s``: stored bytes one process verifies per second)
is measured, not assumed: every chunk a recovery verifies is timed on the thread that
verifies it (``timed_decode``), and the median rate of the recent ones is used; before
any recovery ran in this process, a short calibration verifies a sample of state-like
data (a few milliseconds) and uses that.
"""

from __future__ import annotations

import random
import statistics
import struct
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import replace

from recovery.cost import Choice, Network, Workload, choose, measured_network
from recovery.plan import ChunkSpec
from ring import codec
from ring.client import Client

__all__ = [
    "VerifyRate",
    "choose_for",
    "measured",
    "timed_decode",
    "verify_rate",
    "workload_of",
]

# Verified chunks remembered per client, and the smallest that says anything of a rate.
RATE_SAMPLES_MAX = 256
RATE_SAMPLE_BYTES_MIN = 64 * 1024
# The calibration: this many rounds of decoding a chunk of state-like data this large.
CALIBRATION_BYTES = 1024 * 1024
CALIBRATION_ROUNDS = 3


class VerifyRate:
    """Stored bytes per CPU second this process verifies at: recent chunks' medians, or
    the calibration while there are none. Thread-safe (decodes run in worker threads)."""

    def __init__(self) -> None:
        self._samples: deque[float] = deque(maxlen=RATE_SAMPLES_MAX)
        self._lock = threading.Lock()
        self._calibrated: float | None = None

    def add(self, stored_bytes: int, cpu_s: float) -> None:
        if stored_bytes >= RATE_SAMPLE_BYTES_MIN and cpu_s > 0:
            with self._lock:
                self._samples.append(stored_bytes / cpu_s)

    def bytes_s(self) -> float:
        with self._lock:
            if self._samples:
                return statistics.median(self._samples)
        if self._calibrated is None:
            self._calibrated = calibrate()
        return self._calibrated


def _state_like(size: int) -> bytes:
    """Rows of keys, counters and timestamps from a seeded generator: data that
    compresses as operator state does (about a third)."""
    rng = random.Random(7)
    row = struct.Struct("<qqqd")
    rows = []
    stamp = 1_700_000_000_000
    for _ in range(size // row.size + 1):
        stamp += rng.randrange(2000)
        rows.append(row.pack(rng.randrange(1_000_000), rng.randrange(500), stamp, rng.random()))
    return b"".join(rows)[:size]


def calibrate() -> float:
    """Stored bytes per CPU second of verifying (decompress, address) state-like chunks."""
    chunk_id, stored = codec.encode(_state_like(CALIBRATION_BYTES))
    rates = []
    for _ in range(CALIBRATION_ROUNDS):
        started = time.thread_time()
        codec.decode_view(stored, chunk_id)
        spent = time.thread_time() - started
        if spent > 0:
            rates.append(len(stored) / spent)
    return statistics.median(rates) if rates else Network().node_bytes_s


_rates: weakref.WeakKeyDictionary[Client, VerifyRate] = weakref.WeakKeyDictionary()
_rates_lock = threading.Lock()


def verify_rate(client: Client) -> VerifyRate:
    """The verify rate measured on ``client``'s recoveries (one per client)."""
    with _rates_lock:
        rate = _rates.get(client)
        if rate is None:
            rate = _rates[client] = VerifyRate()
        return rate


def timed_decode(rate: VerifyRate, stored: bytes | memoryview, chunk_id: str) -> bytes | memoryview:
    """``codec.decode_view``, its CPU time added to ``rate`` (run in a worker thread)."""
    started = time.thread_time()
    raw = codec.decode_view(stored, chunk_id)
    rate.add(len(stored), time.thread_time() - started)
    return raw


def workload_of(specs: Sequence[ChunkSpec], *, failed_peers: int = 0) -> Workload:
    holders = {holder for spec in specs for holder in spec.holders}
    return Workload(
        state_bytes=sum(spec.stored_bytes for spec in specs),
        chunks=len(specs),
        holders=max(len(holders), 1) if specs else len(holders),
        failed_peers=failed_peers,
    )


def measured(client: Client, base: Network | None = None) -> Network:
    """``base`` with bandwidth and round trip measured from the client's recent requests
    (medians; values without samples stay as ``base`` has them), and the CPU rate
    measured on this process's recent verifications (or calibrated)."""
    transport = client.transport
    network = measured_network(transport.transfers(), transport.round_trips(), base=base)
    return replace(network, node_bytes_s=verify_rate(client).bytes_s())


def choose_for(
    client: Client,
    specs: Sequence[ChunkSpec],
    network: Network | None = None,
    *,
    failed_peers: int = 0,
) -> Choice:
    """The cost model's choice for recovering ``specs``; ``network`` None: measured."""
    return choose(workload_of(specs, failed_peers=failed_peers), network or measured(client))
