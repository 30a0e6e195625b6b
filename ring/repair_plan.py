"""What one peer should do for each replica it holds: pure decisions, no I/O.

Given a chunk's preference list (the R peers that should hold it), which peers hold it
(learned this round) and which are alive, a holder decides whether to push copies and
whether its own copy is an extra one that can go. Exactly one live holder coordinates
each chunk: the first live preference member that holds it, or, when no preference
member holds it (every copy sits on extra peers, after hinted writes or a placement
change), the extra holder with the smallest peer id. Only the coordinator pushes and
counts the chunk as under-replicated, so the ring does not copy a chunk three times or
count it twice.

An extra copy (held by a peer outside the preference list) is deleted only when every
preference member is alive and holds the chunk: the ring never drops below R copies to
collect garbage.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["ChunkAction", "RecordAction", "plan_chunk", "plan_record"]


@dataclass(frozen=True, slots=True)
class ChunkAction:
    push_to: tuple[str, ...]
    delete_local: bool
    coordinator: bool
    under_replicated: bool


def plan_chunk(
    me: str,
    preference: Sequence[str],
    holders: Collection[str],
    live: Collection[str],
    replication: int,
) -> ChunkAction:
    """Decide for a chunk that ``me`` holds (``me`` must be in ``holders``)."""
    if me not in holders:
        raise AssertionError("plan_chunk is only for chunks this peer holds")
    live_preference = [peer for peer in preference if peer in live]
    missing = tuple(peer for peer in live_preference if peer not in holders)
    live_copies = sum(1 for peer in live_preference if peer in holders)
    under = live_copies < min(replication, len(preference))
    preferred_holder = next((peer for peer in live_preference if peer in holders), None)
    if me in preference:
        coordinator = preferred_holder == me
        return ChunkAction(
            missing if coordinator else (), False, coordinator, under and coordinator
        )
    if preferred_holder is None:
        extras = sorted(peer for peer in holders if peer not in preference and peer in live)
        coordinator = bool(extras) and extras[0] == me
        return ChunkAction(missing if coordinator else (), False, coordinator, coordinator)
    # An extra copy goes only once R live preference members hold the chunk: with fewer
    # than R members in placement (two peers leaving at once, a removal mid-hand-over)
    # the preference list is short, and "all of it" would be fewer than R copies.
    complete = len(preference) >= replication and all(
        peer in live and peer in holders for peer in preference
    )
    return ChunkAction((), complete, False, False)


@dataclass(frozen=True, slots=True)
class RecordAction:
    push_to: tuple[str, ...]
    delete_local: bool


def plan_record(
    me: str,
    preference: Sequence[str],
    versions: Mapping[str, int],
    live: Collection[str],
    replication: int,
) -> RecordAction:
    """Decide for a record ``me`` holds; ``versions`` maps peers to the version they hold
    (absent or 0: none). The newest version is pushed to live preference members that
    are behind by its first live holder among the preference members (one copy sent, not
    one per holder: a create leaves one acceptor of five to repair), and by every holder
    outside them (a peer handing its records over)."""
    mine = versions.get(me, 0)
    if mine <= 0:
        raise AssertionError("plan_record is only for records this peer holds")
    newest = max(versions.values())
    behind = tuple(
        peer for peer in preference if peer in live and peer != me and versions.get(peer, 0) < mine
    )
    first_holder = next(
        (p for p in preference if (p == me or p in live) and versions.get(p, 0) == newest), None
    )
    pusher = me not in preference or first_holder == me
    push = behind if mine == newest and pusher else ()
    if me in preference:
        return RecordAction(push, False)
    caught_up = len(preference) >= replication and all(
        peer in live and versions.get(peer, 0) >= mine for peer in preference
    )
    return RecordAction(push, caught_up)
