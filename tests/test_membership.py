"""The member table (ring.membership) with an injected clock: merging and liveness."""

from __future__ import annotations

import pytest

from ring.errors import ProtocolError
from ring.membership import Entry, MemberTable, Timeouts


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def entry(peer_id: str, *, epoch: int = 1, heartbeat: int = 0, status: str = "up") -> Entry:
    return Entry(peer_id, f"127.0.0.1:{7400 + int(peer_id[1:])}", "", status, epoch, heartbeat)


def table(clock: Clock) -> MemberTable:
    return MemberTable(entry("p1"), clock, Timeouts(failure_timeout_s=5, removal_grace_s=30))


def test_newer_entries_win_and_older_ones_are_ignored() -> None:
    clock = Clock()
    members = table(clock)
    assert members.merge([entry("p2", heartbeat=3)]) == ["p2"]
    assert members.merge([entry("p2", heartbeat=4)]) == []
    assert members.merge([entry("p2", heartbeat=2)]) == []
    assert members.merge([entry("p2", epoch=2, heartbeat=0)]) == ["p2"]
    assert members.entry("p2") == entry("p2", epoch=2, heartbeat=0)
    # Nobody else can speak for this peer.
    assert members.merge([entry("p1", epoch=9)]) == []


def test_silence_turns_up_into_down_then_removed_and_a_heartbeat_brings_it_back() -> None:
    clock = Clock()
    members = table(clock)
    members.merge([entry("p2")])
    assert members.liveness("p2") == "up"
    clock.now += 6
    assert members.liveness("p2") == "down"
    assert "p2" in {m.peer_id for m in members.placement()}
    assert "p2" not in members.live()
    clock.now += 30
    assert members.liveness("p2") == "removed"
    assert "p2" not in {m.peer_id for m in members.placement()}
    members.merge([entry("p2", heartbeat=1)])
    assert members.liveness("p2") == "up"


def test_announced_stop_is_down_at_once_and_leaving_is_out_of_placement() -> None:
    clock = Clock()
    members = table(clock)
    members.merge([entry("p2", status="stopped"), entry("p3", status="leaving")])
    assert members.liveness("p2") == "down"
    assert members.liveness("p3") == "left"
    assert {m.peer_id for m in members.placement()} == {"p1", "p2"}


def test_own_entry_beats_and_changes_status() -> None:
    clock = Clock()
    members = table(clock)
    assert members.beat().heartbeat == 1
    assert members.set_status("leaving").heartbeat == 2
    assert members.liveness("p1") == "left"


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"peer_id": "p", "address": "a:1", "status": "zombie", "epoch": 1, "heartbeat": 0},
        {"peer_id": "", "address": "a:1", "status": "up", "epoch": 1, "heartbeat": 0},
        {"peer_id": "p", "address": "a:1", "status": "up", "epoch": -1, "heartbeat": 0},
        {"peer_id": "p", "address": "a:1", "status": "up", "epoch": "x", "heartbeat": 0},
        ["not", "a", "dict"],
    ],
)
def test_malformed_entries_are_refused(data: object) -> None:
    with pytest.raises(ProtocolError):
        Entry.from_json(data)


def test_grace_shorter_than_failure_timeout_is_refused() -> None:
    with pytest.raises(ValueError):
        MemberTable(entry("p1"), Clock(), Timeouts(failure_timeout_s=10, removal_grace_s=5))
