"""The member table: who is in the ring, and who is alive, as this peer sees it.

Pure state, no I/O: gossip (``ring.gossip``) feeds it entries from other peers and a
monotonic clock decides liveness. Each entry is owned by its peer, which alone changes its status
and bumps its heartbeat; an entry replaces another only if its ``(epoch, heartbeat)`` is
newer. ``epoch`` grows on every start of a peer, so a restarted peer's entries win over
whatever the ring remembers of its previous life.

Liveness is judged locally with a suspicion timeout (documented in the README):

* ``up``       the peer's heartbeat advanced within ``failure_timeout_s``;
* ``down``     it did not (or the peer announced ``stopped``): reads and writes go
               around it, writes leave hints, but it keeps its place in placement;
* ``removed``  it stayed silent for ``removal_grace_s``: it leaves placement and the
               ring re-replicates what it held;
* ``leaving``  it announced ``leaving`` (``sr3 peer leave``): out of placement at once
               (no longer a write target), it hands what it holds over to the peers
               that take its place; silent for ``removal_grace_s``, it is ``removed``;
* ``left``     it announced ``left``: every chunk and record it held is on R peers
               without it, and it exits.

A peer whose heartbeat advances again is ``up`` again, whatever it was before.

Silence is a duration measured on this peer's monotonic clock, from the moment it saw a
peer's heartbeat advance: never the wall clock, whose steps (NTP) would mark every peer
down at once (forward) or hide a failure (backward).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from ring.errors import ProtocolError
from ring.placement import Member

__all__ = [
    "COUNTER_MAX",
    "MEMBERS_MAX",
    "STATUSES",
    "Entry",
    "MemberTable",
    "Timeouts",
]

MEMBERS_MAX = 1024
# Epochs and heartbeats: exact in every JSON reader, and far beyond any peer's lifetime.
COUNTER_MAX = 2**53 - 1
STATUSES = ("up", "stopped", "leaving", "left")
_ID_CHARS_MAX = 128
_ADDRESS_CHARS_MAX = 300
_ADDRESS_PATTERN = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):([0-9]{1,5})")


@dataclass(frozen=True, slots=True)
class Entry:
    """One peer's self-description, as it gossips it."""

    peer_id: str
    address: str
    zone: str
    status: str
    epoch: int
    heartbeat: int

    @property
    def version(self) -> tuple[int, int]:
        return (self.epoch, self.heartbeat)

    @property
    def member(self) -> Member:
        return Member(self.peer_id, self.address, self.zone)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> Entry:
        """An entry as gossiped: strings of bounded length, a known status, and epoch and
        heartbeat as integers in ``0..COUNTER_MAX`` (no floats, bools or huge numbers)."""
        if not isinstance(data, dict):
            raise ProtocolError("a member entry is a JSON object")
        try:
            entry = cls(
                peer_id=_name(data["peer_id"], "peer_id", empty=False),
                address=_address(data["address"]),
                zone=_name(data.get("zone", ""), "zone", empty=True),
                status=_text(data["status"], "status", _ID_CHARS_MAX),
                epoch=_counter(data["epoch"], "epoch"),
                heartbeat=_counter(data["heartbeat"], "heartbeat"),
            )
        except KeyError as exc:
            raise ProtocolError(f"malformed member entry: {exc!r}") from exc
        if entry.status not in STATUSES:
            raise ProtocolError(f"invalid member entry for {entry.peer_id[:40]!r}")
        return entry


def _text(value: Any, name: str, chars_max: int, *, empty: bool = False) -> str:
    if not isinstance(value, str) or not (0 if empty else 1) <= len(value) <= chars_max:
        raise ProtocolError(f"a member entry's {name} is a string of at most {chars_max}")
    return value


def _name(value: Any, name: str, *, empty: bool) -> str:
    """A peer id or zone: printable ASCII without spaces. Ids are hashed onto the ring
    (``.encode()``) and named in file names and logs; a lone surrogate or a control
    character gossiped once would break placement on every peer that learned it."""
    text = _text(value, name, _ID_CHARS_MAX, empty=empty)
    if not (text.isascii() and text.isprintable()) or " " in text:
        raise ProtocolError(f"a member entry's {name} is printable ASCII without spaces")
    return text


def _address(value: Any) -> str:
    """``host:port`` as peers dial it: an ASCII host name or IP, a port in 1..65535."""
    address = _text(value, "address", _ADDRESS_CHARS_MAX)
    match = _ADDRESS_PATTERN.fullmatch(address)
    if match is None or not 0 < int(match.group(1)) < 65536:
        raise ProtocolError(f"a member entry's address {address[:80]!r} is not host:port")
    return address


def _counter(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= COUNTER_MAX:
        raise ProtocolError(f"a member entry's {name} is an integer in 0..{COUNTER_MAX}")
    return value


@dataclass(frozen=True, slots=True)
class Timeouts:
    failure_timeout_s: float = 5.0
    removal_grace_s: float = 60.0


class MemberTable:
    """Entries by peer id, with the local time each one last advanced.

    ``clock`` is monotonic (``Clocks.monotonic``): it only measures silences."""

    def __init__(
        self, me: Entry, clock: Callable[[], float], timeouts: Timeouts = Timeouts()
    ) -> None:
        if timeouts.removal_grace_s < timeouts.failure_timeout_s:
            raise ValueError("the removal grace period cannot be shorter than the failure timeout")
        self._clock = clock
        self.timeouts = timeouts
        self.me = me.peer_id
        self._entries: dict[str, Entry] = {me.peer_id: me}
        self._advanced_at: dict[str, float] = {me.peer_id: clock()}

    # -- own entry ----------------------------------------------------------------------

    @property
    def own(self) -> Entry:
        return self._entries[self.me]

    def beat(self) -> Entry:
        """Advance this peer's heartbeat (once per gossip round)."""
        own = self.own
        self._entries[self.me] = replace(own, heartbeat=own.heartbeat + 1)
        self._advanced_at[self.me] = self._clock()
        return self._entries[self.me]

    def set_status(self, status: str) -> Entry:
        if status not in STATUSES:
            raise ValueError(f"unknown status {status!r}")
        own = self.own
        self._entries[self.me] = replace(own, status=status, heartbeat=own.heartbeat + 1)
        return self._entries[self.me]

    # -- gossip -------------------------------------------------------------------------

    def merge(self, entries: Iterable[Entry]) -> list[str]:
        """Take every entry newer than ours; return the peer ids that are new or changed
        epoch or status (not those whose heartbeat merely advanced)."""
        changed = []
        now = self._clock()
        for entry in entries:
            if entry.peer_id == self.me:
                continue
            known = self._entries.get(entry.peer_id)
            if known is not None and known.version >= entry.version:
                continue
            if known is None and len(self._entries) >= MEMBERS_MAX:
                continue
            self._entries[entry.peer_id] = entry
            self._advanced_at[entry.peer_id] = now
            if known is None or (known.epoch, known.status) != (entry.epoch, entry.status):
                changed.append(entry.peer_id)
        return changed

    def entries(self) -> list[Entry]:
        return sorted(self._entries.values(), key=lambda entry: entry.peer_id)

    def entry(self, peer_id: str) -> Entry | None:
        return self._entries.get(peer_id)

    # -- liveness -----------------------------------------------------------------------

    def liveness(self, peer_id: str) -> str:
        """``up``, ``down``, ``removed``, ``leaving`` or ``left`` (see the module
        docstring)."""
        entry = self._entries[peer_id]
        if entry.status == "left":
            return "left"
        if peer_id == self.me:
            return "leaving" if entry.status == "leaving" else "up"
        silent_s = self._clock() - self._advanced_at[peer_id]
        if silent_s > self.timeouts.removal_grace_s:
            return "removed"
        if entry.status == "leaving":
            return "leaving"
        if entry.status == "stopped" or silent_s > self.timeouts.failure_timeout_s:
            return "down"
        return "up"

    def states(self) -> Mapping[str, str]:
        return {peer_id: self.liveness(peer_id) for peer_id in sorted(self._entries)}

    def placement(self) -> tuple[Member, ...]:
        """Members that own data: up or down, not removed, leaving or left."""
        return tuple(
            self._entries[peer_id].member
            for peer_id, state in self.states().items()
            if state in ("up", "down")
        )

    def live(self) -> frozenset[str]:
        return frozenset(peer_id for peer_id, state in self.states().items() if state == "up")
