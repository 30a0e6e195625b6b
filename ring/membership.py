"""The member table: who is in the ring, and who is alive, as this peer sees it.

Pure state, no I/O: gossip (``ring.gossip``) feeds it entries from other peers and a
monotonic clock decides liveness. Each entry is owned by its peer, which alone changes its status
and bumps its heartbeat; an entry replaces another only if its ``(epoch, heartbeat)`` is
newer. ``epoch`` grows on every start of a peer, so a restarted peer's entries win over
whatever the ring remembers of its previous life.

Who places data is not decided here: placement is the members of the configuration
the voters decided (``ring.cluster``), set in ``configuration`` as each epoch is learned.
What this table judges, locally and fast, is liveness (documented in the README):

* ``up``       a member whose heartbeat advanced within ``failure_timeout_s``;
* ``down``     a member whose heartbeat did not (or that announced ``stopped``): reads
               and writes go around it, writes leave hints, but it keeps its place in
               placement. Silent for ``removal_grace_s``, a voter proposes its removal,
               which takes effect only if a majority of the voters agree;
* ``leaving``  a member that announced ``leaving`` (``sr3 peer leave``), until the epoch
               that removes it is learned;
* ``joining``  a peer that is not a member (yet): it asks to be added;
* ``removed``  a peer that is not a member and is silent;
* ``left``     it announced ``left``: every chunk and record it held is on R peers
               without it, and it exits.

A member whose heartbeat advances again is ``up`` again, whatever it was before.

Silence is a duration measured on this peer's monotonic clock, from the moment it saw a
peer's heartbeat advance: never the wall clock, whose steps (NTP) would mark every peer
down at once (forward) or hide a failure (backward).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from ring.cluster import Configuration, check_address, check_name, check_networks
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


@dataclass(frozen=True, slots=True)
class Entry:
    """One peer's self-description, as it gossips it."""

    peer_id: str
    address: str
    zone: str
    status: str
    epoch: int
    heartbeat: int
    # The configuration epoch at which this peer last finished catching up on every
    # record it answers for (``ring.settle``; 0: not yet).
    settled: int = 0
    # Its addresses on other networks than the peers' own (``ring.cluster``), by name.
    networks: tuple[tuple[str, str], ...] = ()

    @property
    def version(self) -> tuple[int, int]:
        return (self.epoch, self.heartbeat)

    @property
    def member(self) -> Member:
        return Member(self.peer_id, self.address, self.zone)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["networks"] = dict(self.networks)
        if not self.networks:
            del data["networks"]
        return data

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
                settled=_counter(data.get("settled", 0), "settled"),
                networks=_networks(data.get("networks", {})),
            )
        except KeyError as exc:
            raise ProtocolError(f"malformed member entry: {exc!r}") from exc
        if entry.status not in STATUSES:
            raise ProtocolError(f"invalid member entry for {entry.peer_id[:40]!r}")
        return entry


def _text(value: Any, name: str, chars_max: int) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= chars_max:
        raise ProtocolError(f"a member entry's {name} is a string of at most {chars_max}")
    return value


def _name(value: Any, name: str, *, empty: bool) -> str:
    try:
        return check_name(value, name, empty=empty)
    except ProtocolError as exc:
        raise ProtocolError(f"a member entry's {exc}") from exc


def _address(value: Any) -> str:
    try:
        return check_address(value)
    except ProtocolError as exc:
        raise ProtocolError(f"a member entry's {exc}") from exc


def _networks(value: Any) -> tuple[tuple[str, str], ...]:
    try:
        return check_networks(value)
    except ProtocolError as exc:
        raise ProtocolError(f"a member entry's {exc}") from exc


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
        # When this peer first knew of each member it never heard from: a silence
        # counts from there, never from before this peer could have heard anything.
        self._known_at: dict[str, float] = {}
        self._configuration: Configuration | None = None

    @property
    def configuration(self) -> Configuration | None:
        """The newest decided configuration this peer learned (``ring.metadata``)."""
        return self._configuration

    @configuration.setter
    def configuration(self, config: Configuration | None) -> None:
        self._configuration = config
        if config is None:
            return
        now = self._clock()
        for member in config.members:
            self._known_at.setdefault(member.peer_id, now)
        if len(self._known_at) > MEMBERS_MAX:
            current = {member.peer_id for member in config.members}
            self._known_at = {p: at for p, at in self._known_at.items() if p in current}

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

    def set_settled(self, epoch: int) -> Entry:
        """Announce that this peer caught up on every record it answers for at ``epoch``."""
        own = self.own
        self._entries[self.me] = replace(own, settled=epoch, heartbeat=own.heartbeat + 1)
        return self._entries[self.me]

    def all_settled(self, config: Configuration) -> bool:
        """Whether every member of ``config`` announced it caught up at its epoch."""
        return all(
            (entry := self._entries.get(member.peer_id)) is not None
            and entry.settled == config.epoch
            for member in config.members
        )

    # -- gossip -------------------------------------------------------------------------

    def merge(
        self, entries: Sequence[Entry], heard_ago_s: Sequence[float] | None = None
    ) -> list[str]:
        """Take every entry newer than ours; return the peer ids that are new or changed
        epoch or status (not those whose heartbeat merely advanced).

        A newer entry is news of its peer, but not necessarily fresh news: one that
        reached the sender long ago may reach this peer late, after its peer died. With
        ``heard_ago_s`` (the sender's age of each entry, as gossip carries them) it counts
        as hearing from the peer that long ago, never later than the sender did; without
        it (the peer's own saved table at start), as hearing from it now."""
        changed = []
        for index, entry in enumerate(entries):
            if entry.peer_id == self.me:
                continue
            known = self._entries.get(entry.peer_id)
            if known is not None and known.version >= entry.version:
                continue
            if known is None and len(self._entries) >= MEMBERS_MAX:
                continue
            self._entries[entry.peer_id] = entry
            self.heard(entry.peer_id, 0.0 if heard_ago_s is None else heard_ago_s[index])
            if known is None or (known.epoch, known.status) != (entry.epoch, entry.status):
                changed.append(entry.peer_id)
        return changed

    def entries(self) -> list[Entry]:
        return sorted(self._entries.values(), key=lambda entry: entry.peer_id)

    def entry(self, peer_id: str) -> Entry | None:
        return self._entries.get(peer_id)

    def heard_ago(self) -> list[float | None]:
        """For each entry (in ``entries()`` order), how long ago this peer last heard
        from it: 0 for itself, None for a peer it never heard from."""
        now = self._clock()
        return [
            0.0 if e.peer_id == self.me
            else None if (at := self._advanced_at.get(e.peer_id)) is None
            else max(0.0, now - at)
            for e in self.entries()
        ]  # fmt: skip

    def heard(self, peer_id: str, ago_s: float) -> None:
        """Another peer heard from ``peer_id`` ``ago_s`` seconds ago (gossip): counts as
        hearing from it then, if that is more recent than this peer did."""
        if peer_id == self.me or peer_id not in self._entries:
            return
        at = self._clock() - ago_s
        if at > self._advanced_at.get(peer_id, float("-inf")):
            self._advanced_at[peer_id] = at

    # -- liveness -----------------------------------------------------------------------

    def silent_s(self, peer_id: str) -> float:
        """How long this peer has not heard from ``peer_id``: 0 for itself; for a member
        it never heard from, since it learned of it (a peer that starts, or learns a
        configuration, before the members' gossip reaches it has not yet had the time
        to hear them); infinite for a peer it knows nothing of."""
        if peer_id == self.me:
            return 0.0
        since = self._advanced_at.get(peer_id, self._known_at.get(peer_id))
        return float("inf") if since is None else self._clock() - since

    def _member(self, peer_id: str) -> bool:
        config = self.configuration
        return config is not None and config.member(peer_id) is not None

    def liveness(self, peer_id: str) -> str:
        """``up``, ``down``, ``leaving``, ``joining``, ``removed`` or ``left`` (see the
        module docstring)."""
        entry = self._entries[peer_id]
        if entry.status == "left":
            return "left"
        silent_s = self.silent_s(peer_id)
        stopped = entry.status == "stopped" or silent_s > self.timeouts.failure_timeout_s
        if not self._member(peer_id):
            return "removed" if stopped else "joining"
        if entry.status == "leaving":
            return "leaving"
        return "down" if stopped else "up"

    def states(self) -> Mapping[str, str]:
        states = {peer_id: self.liveness(peer_id) for peer_id in sorted(self._entries)}
        for member in self.placement():
            # A member never heard from (this peer learned the epoch before its gossip).
            states.setdefault(member.peer_id, "down")
        return states

    def suspects(self) -> frozenset[str]:
        """Members this peer has not heard from within the failure timeout (or that
        announced they stopped): what it answers a voter that considers a removal."""
        config = self.configuration
        if config is None:
            return frozenset()
        return frozenset(
            member.peer_id
            for member in config.members
            if member.peer_id != self.me
            and (
                self.silent_s(member.peer_id) > self.timeouts.failure_timeout_s
                or (
                    (entry := self._entries.get(member.peer_id)) is not None
                    and entry.status == "stopped"
                )
            )
        )

    def placement(self) -> tuple[Member, ...]:
        """The members of the decided configuration: they own data, up or down."""
        config = self.configuration
        return () if config is None else config.members

    def live(self) -> frozenset[str]:
        """Members that are up."""
        return frozenset(peer_id for peer_id, state in self.states().items() if state == "up")
