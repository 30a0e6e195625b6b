"""The CPU rate the cost model uses is measured on this machine, not assumed.

What must hold: before any recovery, a calibration (verifying state-like chunks) gives
a finite positive rate; once chunks were verified (``timed_decode``), the rate is the
median of theirs, chunks too small to say anything left out; ``measured`` hands the
cost model that rate, per client.
"""

from __future__ import annotations

import math

from recovery.auto import RATE_SAMPLE_BYTES_MIN, VerifyRate, measured, timed_decode, verify_rate
from recovery.cost import Network
from ring import codec
from ring.client import Client
from sr3.statedata import state_bytes

SECRET = "s" * 32


def test_the_rate_is_calibrated_then_measured_from_verified_chunks() -> None:
    rate = VerifyRate()
    calibrated = rate.bytes_s()
    assert math.isfinite(calibrated) and calibrated > 0
    rate.add(RATE_SAMPLE_BYTES_MIN - 1, 0.001)  # too small: says nothing
    assert rate.bytes_s() == calibrated
    for seconds in (0.01, 0.02, 0.04):
        rate.add(1_000_000, seconds)
    assert rate.bytes_s() == 1_000_000 / 0.02


def test_timed_decode_verifies_and_records_what_it_cost() -> None:
    rate = VerifyRate()
    raw = state_bytes(1024 * 1024, seed=5)
    chunk_id, stored = codec.encode(raw)
    assert bytes(timed_decode(rate, stored, chunk_id)) == raw
    assert len(rate._samples) == 1


async def test_measured_networks_carry_the_clients_own_rate() -> None:
    async with Client("127.0.0.1:9", SECRET) as one, Client("127.0.0.1:9", SECRET) as other:
        verify_rate(one).add(10_000_000, 0.01)
        assert measured(one).node_bytes_s == 1e9
        assert measured(one, Network(node_bytes_s=1.0)).node_bytes_s == 1e9
        assert measured(other).node_bytes_s == verify_rate(other).bytes_s() != 1e9
