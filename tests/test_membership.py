"""The member table (ring.membership) with an injected clock: merging and liveness."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from ring.clock import Clocks
from ring.cluster import ClusterAnswer, Configuration
from ring.errors import ProtocolError
from ring.membership import Entry, MemberTable, Timeouts
from ring.node import Node
from ring.paxos import Ballot, Slot, Value
from ring.peer_config import PeerConfig

CLUSTER = "c" * 32


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def entry(peer_id: str, *, epoch: int = 1, heartbeat: int = 0, status: str = "up") -> Entry:
    return Entry(peer_id, f"127.0.0.1:{7400 + int(peer_id[1:])}", "", status, epoch, heartbeat)


def configured(*peer_ids: str, epoch: int = 1) -> Configuration:
    return Configuration(CLUSTER, epoch, tuple(entry(peer_id).member for peer_id in peer_ids))


def table(clock: Clock, *members: str) -> MemberTable:
    """p1's table, placing with a configuration of ``members`` (p1 to p4 by default)."""
    held = MemberTable(entry("p1"), clock, Timeouts(failure_timeout_s=5, removal_grace_s=30))
    held.configuration = configured(*(members or ("p1", "p2", "p3", "p4")))
    return held


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


def test_silence_makes_a_member_down_and_suspected_but_only_a_decision_removes_it() -> None:
    """Breaks: p2 falls silent past the failure timeout, then far past the removal
    grace. Must hold: it is down and suspected, but stays in placement however long it
    is silent (this peer never removes it alone); once a configuration without it is
    learned it is removed, and a heartbeat makes it a peer asking to join, up again
    once a configuration names it."""
    clock = Clock()
    members = table(clock)
    members.merge([entry("p2")])
    assert members.liveness("p2") == "up"
    clock.now += 6
    assert members.liveness("p2") == "down"
    assert "p2" in members.suspects()
    assert "p2" not in members.live()
    clock.now += 300
    assert members.liveness("p2") == "down"
    assert members.silent_s("p2") > 30
    assert "p2" in {m.peer_id for m in members.placement()}
    members.configuration = configured("p1", "p3", "p4", epoch=2)
    assert members.liveness("p2") == "removed"
    assert "p2" not in {m.peer_id for m in members.placement()}
    members.merge([entry("p2", heartbeat=1)])
    assert members.liveness("p2") == "joining"
    members.configuration = configured("p1", "p2", "p3", "p4", epoch=3)
    assert members.liveness("p2") == "up"


def test_a_late_relayed_heartbeat_of_a_silent_peer_does_not_bring_it_back() -> None:
    """Breaks: p2 dies; its last heartbeat reached another peer but not this one, which
    removes p2 once silent; gossip then relays that heartbeat here, seconds later, with
    the sender's age for it. Must hold: the entry is taken, but counts as heard when the
    sender heard it: p2 stays silent and removed, never "joining" (a dead peer shown
    alive for a failure timeout); a relayed heartbeat heard recently still counts as
    life, and without ages (the peer's own saved table) an entry counts as heard now."""
    clock = Clock()
    members = table(clock)
    members.merge([entry("p2", heartbeat=7)])
    clock.now += 12
    members.configuration = configured("p1", "p3", "p4", epoch=2)
    assert members.liveness("p2") == "removed"
    assert members.merge([entry("p2", heartbeat=8)], [11.5]) == []
    assert members.entry("p2") == entry("p2", heartbeat=8)
    assert members.silent_s("p2") == pytest.approx(11.5)
    assert members.liveness("p2") == "removed"
    # A sender that heard p2 moments ago: p2 is alive and asks to join.
    members.merge([entry("p2", heartbeat=9)], [0.3])
    assert members.liveness("p2") == "joining"
    # An older age never makes what this peer heard older.
    members.merge([entry("p2", heartbeat=10)], [20.0])
    assert members.silent_s("p2") == pytest.approx(0.3)
    members.merge([entry("p3", heartbeat=1)])
    assert members.silent_s("p3") == 0.0


def test_announced_stop_is_down_at_once_and_leaving_stays_placed_until_decided() -> None:
    clock = Clock()
    members = table(clock)
    members.merge(
        [entry("p2", status="stopped"), entry("p3", status="leaving"), entry("p4", status="left")]
    )
    assert members.liveness("p2") == "down"
    assert "p2" in members.suspects()
    # Leaving is not left: the peer is still handing its data over.
    assert members.liveness("p3") == "leaving"
    assert members.liveness("p4") == "left"
    # Placement is the decided configuration's, whatever peers announce.
    assert {m.peer_id for m in members.placement()} == {"p1", "p2", "p3", "p4"}
    members.configuration = configured("p1", "p2", epoch=2)
    assert {m.peer_id for m in members.placement()} == {"p1", "p2"}
    assert members.live() == {"p1"}


def test_a_leaving_peer_out_of_the_configuration_that_goes_silent_is_removed() -> None:
    clock = Clock()
    members = table(clock)
    members.merge([entry("p3", status="leaving")])
    clock.now += 6
    assert members.liveness("p3") == "leaving"
    members.configuration = configured("p1", "p2", "p4", epoch=2)
    assert members.liveness("p3") == "removed"


def test_a_peer_before_any_configuration_places_nothing() -> None:
    members = MemberTable(entry("p1"), Clock())
    members.merge([entry("p2")])
    assert members.placement() == ()
    assert members.liveness("p2") == "joining"
    assert members.suspects() == frozenset()


def test_own_entry_beats_and_changes_status() -> None:
    clock = Clock()
    members = table(clock)
    assert members.beat().heartbeat == 1
    assert members.set_status("leaving").heartbeat == 2
    assert members.liveness("p1") == "leaving"
    members.set_status("left")
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


# -- clocks: liveness runs on the monotonic clock, whatever the wall clock does ----------

HOUR_S = 3600.0


class SteppedClocks:
    """A monotonic clock that only moves forward, and a wall clock that can also step
    (an NTP correction)."""

    def __init__(self) -> None:
        self.monotonic_now = 50.0
        self.wall_now = 1_700_000_000.0
        self.clocks = Clocks(monotonic=lambda: self.monotonic_now, wall=lambda: self.wall_now)

    def tick(self, seconds: float, *, wall_step_s: float = 0.0) -> None:
        self.monotonic_now += seconds
        self.wall_now += seconds + wall_step_s


def state(members: MemberTable, peer_id: str) -> str:
    """``peer_id``'s liveness, or ``overdue`` once it is silent past the removal grace
    (when voters consider removing it)."""
    if members.silent_s(peer_id) > members.timeouts.removal_grace_s:
        return "overdue"
    return members.liveness(peer_id)


def states_while_p2_beats(
    members: MemberTable, time: SteppedClocks, wall_step_s: float
) -> set[str]:
    """p2 beats every second for 20 s; the wall clock steps by ``wall_step_s`` at 10 s.
    Every state p2 was seen in, checked after each tick and before the next beat."""
    members.merge([entry("p2")])
    seen = set()
    for second in range(1, 21):
        time.tick(1.0, wall_step_s=wall_step_s if second == 10 else 0.0)
        seen.add(state(members, "p2"))
        members.merge([entry("p2", heartbeat=second)])
    return seen


def states_while_p2_is_silent(
    members: MemberTable, time: SteppedClocks, wall_step_s: float
) -> list[str]:
    """p2 beats once, then falls silent for 40 s (failure timeout 5 s, grace 30 s); the
    wall clock steps by ``wall_step_s`` after 1 s. p2's state after 3, 10 and 40 s."""
    members.merge([entry("p2")])
    time.tick(1.0, wall_step_s=wall_step_s)
    states = []
    for silent_s in (2.0, 7.0, 30.0):
        time.tick(silent_s)
        states.append(state(members, "p2"))
    return states


def node_table(tmp_path: Path, time: SteppedClocks) -> tuple[Node, MemberTable]:
    """A peer's member table as ``Node`` wires it (no socket is opened)."""
    config = PeerConfig(
        "p1", "127.0.0.1", 7401, tmp_path, "s" * 32,
        failure_timeout_s=5.0, removal_grace_s=30.0, overlay=False,
    )  # fmt: skip
    node = Node(config, time.clocks)
    node.open()
    if node.table.configuration is None:
        node.table.configuration = configured("p1", "p2")
    return node, node.table


@pytest.mark.parametrize("wall_step_s", [HOUR_S, -HOUR_S])
async def test_a_wall_clock_step_marks_no_beating_peer_down(
    tmp_path: Path, wall_step_s: float
) -> None:
    """Breaks: the wall clock steps an hour forward (or back) while p2 keeps beating and
    the monotonic clock advances normally. Must hold: p2 is up at every check."""
    time = SteppedClocks()
    _, members = node_table(tmp_path, time)
    assert states_while_p2_beats(members, time, wall_step_s) == {"up"}


@pytest.mark.parametrize("wall_step_s", [HOUR_S, -HOUR_S, 0.0])
async def test_a_silent_peer_goes_down_then_removed_on_the_monotonic_clock(
    tmp_path: Path, wall_step_s: float
) -> None:
    """Breaks: p2 falls silent and the wall clock steps (a step back would hide the
    silence from a wall-clock detector). Must hold: down after the failure timeout,
    overdue for removal after the removal grace, as measured on the monotonic clock."""
    time = SteppedClocks()
    _, members = node_table(tmp_path, time)
    assert states_while_p2_is_silent(members, time, wall_step_s) == ["up", "down", "overdue"]


def test_the_scenarios_catch_a_detector_on_the_wall_clock() -> None:
    """The two scenarios above fail for a table fed the wall clock (what ``ring.server``
    used to pass): a forward step marks a beating peer down, a backward one hides a
    silent peer's failure."""
    time = SteppedClocks()
    members = MemberTable(entry("p1"), time.clocks.wall, Timeouts(5.0, 30.0))
    members.configuration = configured("p1", "p2")
    assert states_while_p2_beats(members, time, HOUR_S) == {"up", "overdue"}
    time = SteppedClocks()
    members = MemberTable(entry("p1"), time.clocks.wall, Timeouts(5.0, 30.0))
    members.configuration = configured("p1", "p2")
    assert states_while_p2_is_silent(members, time, -HOUR_S) == ["up", "up", "up"]


async def test_durations_of_a_node_ignore_wall_steps_and_stored_times_use_wall(
    tmp_path: Path,
) -> None:
    """Breaks: the wall clock steps back an hour just after a foreground read ends.
    Must hold: background work waits only the quiet period (monotonic), while a
    tombstone stored afterwards carries the wall time (it is compared across restarts)."""
    time = SteppedClocks()
    node, _ = node_table(tmp_path, time)
    node.foreground.enter()
    node.foreground.leave()
    assert node.foreground.busy
    time.tick(1.0, wall_step_s=-HOUR_S)
    assert not node.foreground.busy
    ballot = Ballot(1, "ab")
    tombstone = await node.records.accept("k", ballot, Value(1, deleted=True, op="01"))
    assert isinstance(tombstone, Slot) and tombstone.deleted_at == time.wall_now
    assert node.clock() == time.wall_now  # request signatures: compared across machines


def save_configurations(
    data_dir: Path, learned_s_ago: float, wall_now: float, settled_epoch: int = 0
) -> None:
    """A saved configuration file: epoch 1 placed keys on p2 alone, epoch 2 (learned
    ``learned_s_ago``) on p1 and p2, so p1 gained every key at epoch 2; every member
    caught up at ``settled_epoch`` (``ring.settle``)."""
    answer = ClusterAnswer(
        configured("p1", "p2", epoch=2), (configured("p2", epoch=1),), settled_epoch
    )
    saved = {**answer.to_json(), "learned_at": [[2, wall_now - learned_s_ago]]}
    (data_dir / "cluster").mkdir(parents=True, exist_ok=True)
    (data_dir / "cluster" / "config.json").write_text(json.dumps(saved))


@pytest.mark.parametrize(
    ("case", "catches_up"),
    [
        # A new data folder: not a member until it joins (then the epoch that adds it
        # makes it catch up); nothing to catch up on at start.
        ("fresh", False),
        # Its configuration replaced the one before long ago: its catch-ups were done.
        ("replaced_long_ago", False),
        # Replaced within the window before it stopped: catch-ups may not have finished.
        ("replaced_recently", True),
        # The same, but every member had caught up at epoch 2: epoch 1 is done.
        ("replaced_recently_and_settled", False),
        # Records written before configurations existed: what it missed is unknown.
        ("records_without_configuration", True),
    ],
)
async def test_a_restarted_peer_catches_up_only_on_what_may_have_moved_while_it_was_away(
    tmp_path: Path, case: str, catches_up: bool
) -> None:
    """Breaks: a peer starts with each kind of saved state. Must hold: it catches up on
    a key before answering for it exactly when a configuration that placed the key
    elsewhere was replaced within the catch-up window (or it cannot know), and once the
    window after its start has passed it no longer does."""
    time = SteppedClocks()
    if case == "replaced_long_ago":
        save_configurations(tmp_path, 3600.0, time.wall_now)
    elif case == "replaced_recently":
        save_configurations(tmp_path, 2.0, time.wall_now)
    elif case == "replaced_recently_and_settled":
        save_configurations(tmp_path, 2.0, time.wall_now, settled_epoch=2)
    elif case == "records_without_configuration":
        old, _ = node_table(tmp_path / "old", time)
        await old.records.accept("manifest/q/0", Ballot(1, "ab"), Value(1, b"v", op="01"))
        (tmp_path / "old" / "cluster" / "config.json").unlink(missing_ok=True)
        tmp_path = tmp_path / "old"
    node, _ = node_table(tmp_path, time)
    assert node.acceptor.needs_catch_up("manifest/q/1") is catches_up
    time.tick(5.0 + 3 * 10.0 + 1.0)  # failure timeout + 3 repair intervals, and a second
    assert node.acceptor.needs_catch_up("manifest/q/1") is False


async def test_a_peer_that_gains_keys_by_a_decided_epoch_catches_up_on_them(
    tmp_path: Path,
) -> None:
    """Breaks: p1, a member of epoch 1 with p2 and p3, learns epoch 2 where p3 left, then
    epoch 4 (epoch 3 missed). Must hold: keys it newly answers for at epoch 2 need a
    catch-up, and so do keys it kept whose acceptors changed (a value chosen by a
    majority of the old group may sit on a minority of the new one); keys whose
    acceptors stayed the same do not; after the missed epoch every key does (what
    epoch 3 placed is unknown)."""
    time = SteppedClocks()
    node, _ = node_table(tmp_path, time)
    await node.metadata.learn([configured("p1", "p2", "p3", "p4", "p5", "p6", "p7")])
    keys = [f"k/{index}" for index in range(200)]
    groups = {key: set(node.acceptor.preferred(key)) for key in keys}
    before = {key for key in keys if "p1" in groups[key]}
    await node.metadata.learn([configured("p1", "p2", "p4", "p5", "p6", "p7", epoch=2)])
    after = {key for key in keys if "p1" in node.acceptor.preferred(key)}
    gained = after - before
    kept = before & after
    moved = {key for key in kept if set(node.acceptor.preferred(key)) != groups[key]}
    assert gained and moved and kept - moved
    assert all(node.acceptor.needs_catch_up(key) for key in gained | moved)
    assert not any(node.acceptor.needs_catch_up(key) for key in kept - moved)
    await node.metadata.learn([configured("p1", "p2", "p4", "p5", "p6", "p7", epoch=4)])
    assert all(node.acceptor.needs_catch_up(key) for key in after)


async def test_once_every_member_caught_up_the_rings_before_are_forgotten_for_good(
    tmp_path: Path,
) -> None:
    """Breaks: p1 gains keys at epoch 2 (epoch 1 placed them on p2 alone); every member
    then announces it caught up at epoch 2. Must hold: p1 needs a catch-up before the
    announcement and none after; the knowledge is saved, so after a restart within the
    window it still needs none; a later epoch makes p1 catch up from epoch 2's ring only
    (a key p1 held all along at epoch 2 needs nothing from epoch 1)."""
    time = SteppedClocks()
    save_configurations(tmp_path, 2.0, time.wall_now)
    node, table = node_table(tmp_path, time)
    assert node.acceptor.needs_catch_up("manifest/q/1")
    table.merge([replace(entry("p2", heartbeat=9), settled=2)])
    assert not table.all_settled(configured("p1", "p2", epoch=2))
    table.set_settled(2)
    assert table.all_settled(configured("p1", "p2", epoch=2))
    await node.metadata.settled(2)
    assert not node.acceptor.needs_catch_up("manifest/q/1")
    again, _ = node_table(tmp_path, time)
    assert again.metadata.settled_epoch == 2
    assert not again.acceptor.needs_catch_up("manifest/q/1")
    await again.metadata.learn([configured("p1", "p2", "p3", epoch=3)])
    moved = [
        key for key in (f"k/{n}" for n in range(100))
        if set(again.acceptor.preferred(key)) != {"p1", "p2"}
    ]  # fmt: skip
    assert moved and all(again.acceptor.needs_catch_up(key) for key in moved)
    assert [ring is not None and len(ring) for ring in again.acceptor.history()] == [2]
