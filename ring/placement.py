"""Placement math for the sr3 ring: where each chunk's replicas live.

Peers sit on a 64-bit token ring through virtual nodes (``vnodes`` tokens per peer). A key
(a chunk id) hashes to a token; its replicas are the first R distinct peers clockwise from
that token (its *preference list*), optionally spread over failure zones first, in the way
Cassandra's rack-aware strategy does. The module also measures a ring: how much of the token
space each peer replicates (``Ring.ownership``) and which token ranges change replicas when
the membership changes (``ownership_diff``), which is what repair and rebalancing stream.

Everything here is pure: values in, values out, no I/O, no clock, no randomness. Token ranges
are half-open ``(start, end]``: a key belongs to the first vnode token at or after its own
token, wrapping through 0. Vnodes whose tokens collide are ordered by peer id, so the peer
with the smaller id wins the range and the other follows it in every walk.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import xxhash

__all__ = [
    "TOKEN_SPACE",
    "VNODES_DEFAULT",
    "Member",
    "RangeChange",
    "Ring",
    "key_token",
    "moved_fraction",
    "ownership_diff",
    "vnode_token",
]

TOKEN_SPACE: int = 2**64

# Chosen from benchmarks/bench_placement.py (benchmarks/results/placement.json, 20 id sets per
# cell). A peer's share is a sum of `vnodes` random arcs, so its spread shrinks like
# 1/sqrt(vnodes). At 256 the most loaded peer holds at most ~1.16x (5 or 8 peers) to ~1.20x
# (32 peers) its fair share over all id sets, and a join moves 0.85-1.15x the ideal 1/(N+1).
# 128 lets the worst peer reach ~1.25x; 512 only gains ~0.05 while doubling ring size, build
# time (100 peers: ~17 ms at 256, ~34 ms at 512) and the cost of every ownership_diff.
VNODES_DEFAULT: int = 256


@dataclass(frozen=True, slots=True)
class Member:
    """One storage peer as placement sees it."""

    peer_id: str
    address: str
    zone: str = ""

    def __post_init__(self) -> None:
        if not self.peer_id:
            raise ValueError("Member.peer_id must be a non-empty string")


def key_token(key: str) -> int:
    """Position of ``key`` on the ring."""
    return xxhash.xxh3_64_intdigest(key.encode())


def vnode_token(peer_id: str, index: int) -> int:
    """Position of virtual node ``index`` of ``peer_id`` on the ring."""
    return xxhash.xxh3_64_intdigest(f"{peer_id}#{index}".encode())


@dataclass(frozen=True)
class Ring:
    """An immutable consistent-hashing ring; build it with ``Ring.build``.

    ``members`` is normalised to peer-id order on construction, so the placement never
    depends on the order in which members were given.
    """

    members: tuple[Member, ...]
    vnodes: int
    zone_aware: bool
    # Sorted vnode tokens and, at the same index, the index in `members` of the owning peer.
    _tokens: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _owners: tuple[int, ...] = field(init=False, repr=False, compare=False)
    # Failure domain of each member: its zone, or a domain of its own when it has no zone.
    _domains: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _domain_count: int = field(init=False, repr=False, compare=False)
    _index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.vnodes < 1:
            raise ValueError(f"vnodes must be >= 1, got {self.vnodes}")
        members = tuple(sorted(self.members, key=lambda member: member.peer_id))
        index = {member.peer_id: position for position, member in enumerate(members)}
        if len(index) != len(members):
            raise ValueError(f"duplicate peer ids in ring members: {_duplicates(members)}")
        tokens, owners = _vnode_table(members, self.vnodes)
        domains = _failure_domains(members)
        object.__setattr__(self, "members", members)
        object.__setattr__(self, "_tokens", tokens)
        object.__setattr__(self, "_owners", owners)
        object.__setattr__(self, "_domains", domains)
        object.__setattr__(self, "_domain_count", len(set(domains)))
        object.__setattr__(self, "_index", index)

    @classmethod
    def build(
        cls,
        members: Iterable[Member],
        *,
        vnodes: int = VNODES_DEFAULT,
        zone_aware: bool = False,
    ) -> Ring:
        """A ring of ``members``; ValueError on duplicate peer ids or ``vnodes < 1``."""
        return cls(tuple(members), vnodes, zone_aware)

    def member(self, peer_id: str) -> Member:
        """The member with ``peer_id``; KeyError if it is not on the ring."""
        return self.members[self._index[peer_id]]

    def __len__(self) -> int:
        return len(self.members)

    def walk(self, key: str) -> tuple[Member, ...]:
        """Every member once, clockwise from the key's token; the first is the primary."""
        if not self.members:
            return ()
        position = self._position(key_token(key))
        return tuple(self.members[owner] for owner in self._distinct_from(position))

    def preference_list(self, key: str, count: int) -> tuple[Member, ...]:
        """The ``count`` members that hold replicas of ``key``, in preference order."""
        _check_count(count)
        if not self.members:
            return ()
        chosen = self._preference_at(self._position(key_token(key)), count)
        return tuple(self.members[owner] for owner in chosen)

    def candidates(self, key: str, count: int) -> tuple[Member, ...]:
        """Every member once: the preference list of ``count`` first, then the rest of the
        walk. Writes take the first reachable ``count``; reads fall back in this order."""
        preferred = self.preference_list(key, count)
        chosen = {member.peer_id for member in preferred}
        return preferred + tuple(m for m in self.walk(key) if m.peer_id not in chosen)

    def ownership(self, replication: int) -> dict[str, float]:
        """Per peer id, the exact fraction of the token space it replicates.

        A peer owns a token when it is in that token's preference list of size
        ``replication``, so the fractions sum to ``min(replication, len(self))``.
        """
        _check_count(replication)
        owned = [0] * len(self.members)
        for position, width in self._ranges():
            if width:
                for owner in self._preference_at(position, replication):
                    owned[owner] += width
        assert sum(owned) == TOKEN_SPACE * min(replication, len(self.members))
        return {member.peer_id: owned[i] / TOKEN_SPACE for i, member in enumerate(self.members)}

    def preference_sets(self, count: int) -> set[tuple[str, ...]]:
        """Every distinct preference list of ``count`` over the token space (peer ids):
        the groups of peers some key is stored on."""
        _check_count(count)
        return {
            tuple(self.members[owner].peer_id for owner in self._preference_at(position, count))
            for position, width in self._ranges()
            if width
        }

    def with_member(self, member: Member) -> Ring:
        """A new ring with ``member`` added; ValueError if its peer id is already present."""
        if member.peer_id in self._index:
            raise ValueError(f"peer {member.peer_id!r} is already on the ring")
        return Ring((*self.members, member), self.vnodes, self.zone_aware)

    def without(self, peer_id: str) -> Ring:
        """A new ring with ``peer_id`` removed; KeyError if it is not on the ring."""
        if peer_id not in self._index:
            raise KeyError(peer_id)
        kept = tuple(member for member in self.members if member.peer_id != peer_id)
        return Ring(kept, self.vnodes, self.zone_aware)

    def _position(self, token: int) -> int:
        """Index of the vnode that owns ``token``: the first at or after it, wrapping."""
        return bisect.bisect_left(self._tokens, token) % len(self._tokens)

    def _ranges(self) -> Iterator[tuple[int, int]]:
        """``(position, width)`` of each elementary range ``(tokens[p-1], tokens[p]]``."""
        tokens = self._tokens
        if tokens:
            yield 0, tokens[0] - tokens[-1] + TOKEN_SPACE
        for position in range(1, len(tokens)):
            yield position, tokens[position] - tokens[position - 1]

    def _distinct_from(self, position: int) -> Iterator[int]:
        """Member indexes in clockwise order from ``position``, each once."""
        seen: set[int] = set()
        owners = self._owners
        # Index from `position` (islice would step through the skipped prefix one by one).
        for index in itertools.chain(range(position, len(owners)), range(position)):
            owner = owners[index]
            if owner not in seen:
                seen.add(owner)
                yield owner
                if len(seen) == len(self.members):
                    return

    def _preference_at(self, position: int, count: int) -> tuple[int, ...]:
        """Member indexes of the preference list for tokens owned by ``position``."""
        walk = self._distinct_from(position)
        if not self.zone_aware:
            return tuple(itertools.islice(walk, count))
        return self._zone_spread(walk, count)

    def _zone_spread(self, walk: Iterator[int], count: int) -> tuple[int, ...]:
        """Peers in unused failure domains first, then the rest in walk order."""
        chosen: list[int] = []
        skipped: list[int] = []
        domains_used: set[int] = set()
        for owner in walk:
            domain = self._domains[owner]
            if domain in domains_used:
                skipped.append(owner)
            else:
                domains_used.add(domain)
                chosen.append(owner)
                if len(chosen) == count:
                    break
            # Once every domain is used, later peers can only fill in walk order.
            if len(domains_used) == self._domain_count and len(chosen) + len(skipped) >= count:
                break
        return tuple(chosen + skipped[: count - len(chosen)])


@dataclass(frozen=True, slots=True)
class RangeChange:
    """A token range ``(start, end]`` whose replica set differs between two rings.

    ``start > end`` means the range wraps through 0; ``start == end`` means the whole ring.
    """

    start: int
    end: int
    old_replicas: tuple[str, ...]
    new_replicas: tuple[str, ...]

    @property
    def gained(self) -> frozenset[str]:
        """Peers that must receive this range."""
        return frozenset(self.new_replicas) - frozenset(self.old_replicas)

    @property
    def lost(self) -> frozenset[str]:
        """Peers that no longer replicate this range."""
        return frozenset(self.old_replicas) - frozenset(self.new_replicas)

    @property
    def width(self) -> int:
        """Number of tokens in the range."""
        return (self.end - self.start) % TOKEN_SPACE or TOKEN_SPACE

    def contains(self, token: int) -> bool:
        """Whether ``token`` falls in ``(start, end]``."""
        return 0 < (token - self.start) % TOKEN_SPACE <= self.width


def ownership_diff(old: Ring, new: Ring, replication: int) -> list[RangeChange]:
    """The token ranges whose replica set differs between ``old`` and ``new``.

    Both rings' vnode tokens cut the ring into elementary ranges on which both preference
    lists are constant; adjacent changed ranges with the same replicas are merged.
    """
    _check_count(replication)
    boundaries = sorted(set(old._tokens) | set(new._tokens))
    old_replicas = _replicas_per_range(old, boundaries, replication)
    new_replicas = _replicas_per_range(new, boundaries, replication)
    changes: list[RangeChange] = []
    for i, end in enumerate(boundaries):
        if set(old_replicas[i]) != set(new_replicas[i]):
            start = boundaries[i - 1]  # i == 0 gives the range that wraps through 0
            changes.append(RangeChange(start, end, old_replicas[i], new_replicas[i]))
    return _merge_adjacent(changes)


def moved_fraction(old: Ring, new: Ring, replication: int) -> float:
    """Fraction of all replica placements that move from ``old`` to ``new``."""
    moved = sum(
        change.width * len(change.gained) for change in ownership_diff(old, new, replication)
    )
    return moved / (TOKEN_SPACE * replication)


def _check_count(count: int) -> None:
    if count < 1:
        raise ValueError(f"replica count must be >= 1, got {count}")


def _duplicates(members: Sequence[Member]) -> list[str]:
    ids = [member.peer_id for member in members]
    return sorted({peer_id for peer_id in ids if ids.count(peer_id) > 1})


def _vnode_table(members: Sequence[Member], vnodes: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Sorted vnode tokens and their owners; ties go to the lower member index (peer id)."""
    table = sorted(
        (vnode_token(member.peer_id, index), owner)
        for owner, member in enumerate(members)
        for index in range(vnodes)
    )
    tokens = tuple(token for token, _ in table)
    owners = tuple(owner for _, owner in table)
    return tokens, owners


def _failure_domains(members: Sequence[Member]) -> tuple[int, ...]:
    """A domain number per member: shared by members of one zone, unique for zoneless ones."""
    numbers: dict[str, int] = {}
    domains: list[int] = []
    for member in members:
        key = member.zone if member.zone else f"\0{member.peer_id}"
        domains.append(numbers.setdefault(key, len(numbers)))
    return tuple(domains)


def _replicas_per_range(
    ring: Ring, boundaries: Sequence[int], replication: int
) -> list[tuple[str, ...]]:
    """Preference list (peer ids) of each range ``(boundaries[i-1], boundaries[i]]``.

    ``ring``'s tokens are a subset of ``boundaries``, so every token in such a range has the
    same owner as the range's end. Consecutive ranges often share an owner; reuse it.
    """
    if not ring.members:
        return [()] * len(boundaries)
    result: list[tuple[str, ...]] = []
    last_position = -1
    replicas: tuple[str, ...] = ()
    for end in boundaries:
        position = ring._position(end)
        if position != last_position:
            chosen = ring._preference_at(position, replication)
            replicas = tuple(ring.members[owner].peer_id for owner in chosen)
            last_position = position
        result.append(replicas)
    return result


def _merge_adjacent(changes: list[RangeChange]) -> list[RangeChange]:
    """Join touching ranges with identical replicas, including across token 0."""
    merged: list[RangeChange] = []
    for change in changes:
        if merged and _joinable(merged[-1], change):
            merged[-1] = RangeChange(
                merged[-1].start, change.end, change.old_replicas, change.new_replicas
            )
        else:
            merged.append(change)
    if len(merged) > 1 and _joinable(merged[-1], merged[0]):
        last = merged.pop()
        merged[0] = RangeChange(last.start, merged[0].end, last.old_replicas, last.new_replicas)
    return merged


def _joinable(before: RangeChange, after: RangeChange) -> bool:
    return (
        before.end == after.start
        and before.old_replicas == after.old_replicas
        and before.new_replicas == after.new_replicas
    )
