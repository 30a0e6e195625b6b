"""Repair decisions (ring.repair_plan) simulated over rounds, without a network.

What must hold: whatever the starting holders and liveness, repeated rounds bring every
live preference member a copy; exactly one holder coordinates; extra copies are dropped
only once all R preference members are alive and hold the chunk; no round ever leaves a
chunk with fewer copies than it had on live preference members.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ring.repair_plan import plan_chunk, plan_record

PEERS = [f"p{index}" for index in range(8)]


@st.composite
def situations(draw: st.DrawFn) -> tuple[list[str], set[str], set[str], int]:
    replication = draw(st.integers(1, 4))
    preference = draw(st.permutations(PEERS))[:replication]
    live = set(draw(st.sets(st.sampled_from(PEERS), min_size=1)))
    holders = set(draw(st.sets(st.sampled_from(sorted(live)), min_size=1)))
    return preference, holders, live, replication


def _round(
    preference: list[str], holders: set[str], live: set[str], replication: int
) -> tuple[set[str], int]:
    actions = {peer: plan_chunk(peer, preference, holders, live, replication) for peer in holders}
    after = set(holders)
    for action in actions.values():
        after.update(action.push_to)
    for peer, action in actions.items():
        if action.delete_local:
            after.discard(peer)
    return after, sum(1 for action in actions.values() if action.coordinator)


@settings(max_examples=400, derandomize=True)
@given(situations())
def test_rounds_converge_to_every_live_preference_member(
    situation: tuple[list[str], set[str], set[str], int],
) -> None:
    preference, holders, live, replication = situation
    for _ in range(3):
        before_on_preference = {peer for peer in preference if peer in holders and peer in live}
        holders, coordinators = _round(preference, holders, live, replication)
        assert coordinators <= 1
        assert before_on_preference <= holders, "a preference copy was lost"
        assert holders, "the last copy was deleted"
        for peer in holders:
            assert peer in live or peer in preference
    assert {peer for peer in preference if peer in live} <= holders
    if all(peer in live for peer in preference):
        assert holders == set(preference), "extra copies outlive a complete preference list"


def test_extra_copy_stays_while_a_preference_member_is_down() -> None:
    preference = ["a", "b", "c"]
    action = plan_chunk("x", preference, {"a", "b", "x"}, {"a", "b", "x"}, 3)
    assert not action.delete_local
    assert action.push_to == ()
    # c comes back: a (first live holder) pushes to it; x deletes only afterwards.
    live = {"a", "b", "c", "x"}
    assert plan_chunk("a", preference, {"a", "b", "x"}, live, 3).push_to == ("c",)
    assert not plan_chunk("x", preference, {"a", "b", "x"}, live, 3).delete_local
    assert plan_chunk("x", preference, {"a", "b", "c", "x"}, live, 3).delete_local


def test_under_replication_is_counted_once_by_the_coordinator() -> None:
    preference = ["a", "b", "c"]
    holders = {"a", "b"}
    live = {"a", "b", "c"}
    counted = [plan_chunk(p, preference, holders, live, 3).under_replicated for p in holders]
    assert counted.count(True) == 1
    full = [plan_chunk(p, preference, set(preference), live, 3) for p in preference]
    assert not any(action.under_replicated for action in full)


def test_only_extra_holders_push_when_no_preference_member_has_it() -> None:
    preference = ["a", "b", "c"]
    live = {"a", "b", "c", "x", "y"}
    first = plan_chunk("x", preference, {"x", "y"}, live, 3)
    second = plan_chunk("y", preference, {"x", "y"}, live, 3)
    assert first.push_to == ("a", "b", "c") and first.coordinator and first.under_replicated
    assert second.push_to == () and not second.coordinator


def test_records_are_pushed_by_newest_holders_and_extras_drop_when_caught_up() -> None:
    preference = ["a", "b", "c"]
    live = {"a", "b", "c", "x"}
    assert plan_record("a", preference, {"a": 3, "b": 2, "c": 0}, live, 3).push_to == ("b", "c")
    assert plan_record("b", preference, {"a": 3, "b": 2}, live, 3).push_to == ()
    # Of the preference members holding the newest, only the first live one pushes.
    assert plan_record("b", preference, {"a": 3, "b": 3, "c": 0}, live, 3).push_to == ()
    assert plan_record("a", preference, {"a": 3, "b": 3, "c": 0}, live, 3).push_to == ("c",)
    assert plan_record("b", preference, {"a": 3, "b": 3}, live - {"a"}, 3).push_to == ("c",)
    extra = plan_record("x", preference, {"x": 3, "a": 3, "b": 3, "c": 3}, live, 3)
    assert extra.delete_local and extra.push_to == ()
    behind = plan_record("x", preference, {"x": 3, "a": 3, "b": 3}, live, 3)
    assert not behind.delete_local and behind.push_to == ("c",)


def test_an_extra_copy_stays_while_placement_is_shorter_than_r() -> None:
    """Two peers leaving at once (or a removal mid-hand-over) leave fewer than R members
    in placement: a preference list of two is not R copies, so the leaver keeps its copy."""
    short = ("a", "b")
    live = {"a", "b", "x"}
    assert not plan_chunk("x", short, {"a", "b", "x"}, live, 3).delete_local
    assert not plan_record("x", short, {"x": 3, "a": 3, "b": 3}, live, 3).delete_local
    full = ("a", "b", "c")
    live_full = {"a", "b", "c", "x"}
    assert plan_chunk("x", full, {"a", "b", "c", "x"}, live_full, 3).delete_local
    assert plan_record("x", full, {"x": 3, "a": 3, "b": 3, "c": 3}, live_full, 3).delete_local


def test_a_leaver_coordinates_a_chunk_only_it_holds() -> None:
    """The leaver is out of placement; when it is the only holder it must push the chunk
    (it counts itself live while leaving), else nobody would."""
    preference = ("a", "b", "c")
    action = plan_chunk("x", preference, {"x"}, {"a", "b", "c", "x"}, 3)
    assert action.push_to == ("a", "b", "c")
