"""Leases held in records: one holder at a time, numbered by a fencing number.

A lease is a record (any key; the Spark connector uses ``spark/<query>/lease``) whose
value says who holds it, with which fence, and for how long after each renewal. It is
taken and renewed by compare-and-set, so at most one taker wins each version: records
are linearizable (``ring.records``). Each take raises the fence by one; a write made
under a lease carries its fence, and a reader that checks it against the lease record
(the namespace server does for ``sr3://`` writes, ``ring.fs_api.fence_query``) refuses
an older holder's.

Time is judged on each side's own monotonic clock, never across machines' wall clocks:

- the holder counts its lease valid until ``timeout_s * (1 - drift)`` after it *sent*
  the renewal that succeeded (``holder_valid_until``);
- anyone else counts a lease lapsed once its record has kept the same version for
  ``timeout_s * (1 + drift)`` of the observer's time since it first saw that version
  (``lapse_after_s``).

With both clocks' rates within ``drift`` of true time, the holder stops before anyone
may take over: the renewal it sent at real time t was chosen before the observer first
saw it, and ``T(1-d)(1+d) < T(1+d)(1-d)`` is an equality only for zero delay. The
wall-clock times stored in the value are for people (``sr3 spark list``), not for the
decision. Pure values and JSON, no I/O.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace
from typing import Any

from ring.errors import ConfigError, ProtocolError
from ring.parse import load_json

__all__ = [
    "DRIFT_DEFAULT",
    "DRIFT_MAX",
    "FENCE_MAX",
    "HOLDER_CHARS_MAX",
    "LEASE_BYTES_MAX",
    "LEASE_FORMAT",
    "NOTE_BYTES_MAX",
    "RENEW_EVERY_S_DEFAULT",
    "TIMEOUT_S_DEFAULT",
    "TIMEOUT_S_MAX",
    "TIMEOUT_S_MIN",
    "Lease",
    "check_holder",
    "check_timing",
    "first_lease",
    "holder_valid_until",
    "lapse_after_s",
    "parse_lease",
]

LEASE_FORMAT = 1
# A lease lapses this long after its last renewal (the holder's own figure is stored in
# the record, so observers use the holder's setting, not theirs).
TIMEOUT_S_DEFAULT = 3.0
TIMEOUT_S_MIN = 0.5
TIMEOUT_S_MAX = 600.0
RENEW_EVERY_S_DEFAULT = 1.0
# Bound on how far a monotonic clock's rate may stray from true time (5 %: far above
# what quartz clocks and NTP-slewed clocks do, ~0.01 %, to cover paused VMs' catch-up).
DRIFT_DEFAULT = 0.05
DRIFT_MAX = 0.2
FENCE_MAX = 2**53 - 1
HOLDER_CHARS_MAX = 200
# A holder name is also a record key's last segment (``sr3 spark list`` finds standbys).
_HOLDER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$")


def check_holder(holder: str) -> str:
    if _HOLDER.match(holder) is None:
        raise ConfigError(
            f"lease holder {holder[:60]!r}: 1-{HOLDER_CHARS_MAX} characters of "
            "[A-Za-z0-9._:-], starting with a letter or digit"
        )
    return holder


def check_timing(timeout_s: float, renew_every_s: float, drift: float) -> None:
    """Refuse settings under which a holder cannot keep its lease: renewals must come
    well inside the part of the timeout the holder counts on (at least two tries)."""
    if not TIMEOUT_S_MIN <= timeout_s <= TIMEOUT_S_MAX:
        raise ConfigError(f"lease timeout must be {TIMEOUT_S_MIN}..{TIMEOUT_S_MAX} s")
    if not 0 <= drift <= DRIFT_MAX:
        raise ConfigError(f"clock drift bound must be 0..{DRIFT_MAX}")
    if not 0 < renew_every_s <= timeout_s * (1 - drift) / 2:
        raise ConfigError(
            f"renewing every {renew_every_s} s with a {timeout_s} s lease leaves no room for "
            f"a retry: renew at most every {timeout_s * (1 - drift) / 2:.3g} s"
        )


def holder_valid_until(sent_at: float, timeout_s: float, drift: float) -> float:
    """When (on the holder's monotonic clock) a lease renewed by a write sent at
    ``sent_at`` stops being the holder's to use."""
    return sent_at + timeout_s * (1 - drift)


def lapse_after_s(timeout_s: float, drift: float) -> float:
    """How long an observer must see a lease's version unchanged before taking it."""
    return timeout_s * (1 + drift)


@dataclass(frozen=True, slots=True)
class Lease:
    """A lease record's value. ``fence``: raised by one at every take (never reused);
    ``released``: its holder gave it up (anyone may take it at once). ``acquired_at``
    and ``renewed_at`` are wall-clock seconds, shown to people only. ``note``: what the
    holder reports (the Spark connector: its newest committed batch), bounded."""

    holder: str
    fence: int
    timeout_s: float
    acquired_at: float
    renewed_at: float
    released: bool = False
    note: dict[str, Any] | None = None

    def renewed(self, wall: float, note: dict[str, Any] | None = None) -> Lease:
        return replace(self, renewed_at=wall, note=self.note if note is None else note)

    def taken_by(self, holder: str, timeout_s: float, wall: float) -> Lease:
        """The lease a new holder writes over this one."""
        if self.fence >= FENCE_MAX:
            raise ProtocolError("lease fence exhausted")
        return Lease(check_holder(holder), self.fence + 1, timeout_s, wall, wall)

    def encode(self) -> bytes:
        data: dict[str, Any] = {
            "format": LEASE_FORMAT,
            "holder": self.holder,
            "fence": self.fence,
            "timeout_s": self.timeout_s,
            "acquired_at": self.acquired_at,
            "renewed_at": self.renewed_at,
        }
        if self.released:
            data["released"] = True
        if self.note is not None:
            data["note"] = self.note
        return json.dumps(data, separators=(",", ":"), sort_keys=True).encode()


NOTE_BYTES_MAX = 2048
# A lease record's value: what ``encode`` writes with the longest holder and note is
# under 3 KiB. Read through the bounded JSON loader (``ring.parse``): a record that any
# fenced write names is untrusted input to the peer that reads it.
LEASE_BYTES_MAX = 8192


def first_lease(holder: str, timeout_s: float, wall: float) -> Lease:
    """The lease of the first holder of a key no one held."""
    return Lease(check_holder(holder), 1, timeout_s, wall, wall)


def parse_lease(raw: bytes) -> Lease:
    """A lease record's value; ``ProtocolError`` when it is not one."""
    try:
        data = load_json(raw, bytes_max=LEASE_BYTES_MAX)
        if not isinstance(data, dict) or data.get("format") != LEASE_FORMAT:
            raise ProtocolError("not a lease record (format 1)")
        fence = data["fence"]
        if isinstance(fence, bool) or not isinstance(fence, int) or not 1 <= fence <= FENCE_MAX:
            raise ProtocolError(f"lease fence must be an integer in 1..{FENCE_MAX}")
        note = data.get("note")
        if note is not None and (
            not isinstance(note, dict) or len(json.dumps(note)) > NOTE_BYTES_MAX
        ):
            raise ProtocolError(f"lease note must be an object of at most {NOTE_BYTES_MAX} bytes")
        return Lease(
            holder=check_holder(str(data["holder"])),
            fence=fence,
            timeout_s=_seconds(data["timeout_s"], TIMEOUT_S_MIN, TIMEOUT_S_MAX),
            acquired_at=_seconds(data["acquired_at"], 0.0, 1e11),
            renewed_at=_seconds(data["renewed_at"], 0.0, 1e11),
            released=data.get("released") is True,
            note=note,
        )
    except ProtocolError:
        raise
    except (ConfigError, KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed lease record: {exc}") from exc


def _seconds(value: Any, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProtocolError(f"lease time {value!r} is not a number")
    seconds = float(value)
    if not math.isfinite(seconds) or not low <= seconds <= high:
        raise ProtocolError(f"lease time {seconds} outside {low}..{high}")
    return seconds
