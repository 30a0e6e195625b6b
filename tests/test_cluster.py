"""Cluster metadata: configurations (ring.cluster) and a peer's copy and vote
(ring.metadata), without a network.

What must hold: a configuration's wire form is bounded and checked (malformed input is a
ProtocolError); voters are a function of the member set alone; a peer learns only
forward, never another cluster's configuration; its vote for epoch N + 1 follows the
rules of Paxos, survives a restart (fsynced before it answers), and refuses what it
cannot take part in (an epoch decided already, one it is not ready for, one it does not
vote in); and a full disk does not take its vote away.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ring.cluster import (
    VOTERS_MAX,
    ClusterAnswer,
    Configuration,
    parse_cluster_answer,
    parse_suspects,
)
from ring.errors import ProtocolError
from ring.metadata import Decided, Metadata, NotVoter, Unready
from ring.paxos import Ballot, Preempted, Slot
from ring.placement import Member

CLUSTER = "ab" * 16


def member(index: int) -> Member:
    return Member(f"peer-{index}", f"10.0.0.{index}:7401", "")


def config(epoch: int, *indexes: int, cluster: str = CLUSTER) -> Configuration:
    return Configuration(cluster, epoch, tuple(member(i) for i in indexes))


def test_a_configuration_round_trips_and_orders_its_members() -> None:
    shuffled = Configuration(CLUSTER, 3, (member(3), member(1), member(2)))
    assert [m.peer_id for m in shuffled.members] == ["peer-1", "peer-2", "peer-3"]
    assert Configuration.decode(shuffled.encode()) == shuffled
    assert shuffled.with_member(member(4)).epoch == 4
    assert shuffled.without(["peer-2"]).ids() == {"peer-1", "peer-3"}
    moved = shuffled.with_member(Member("peer-2", "10.9.9.9:7401", "z"))
    assert moved.member("peer-2") == Member("peer-2", "10.9.9.9:7401", "z")


@pytest.mark.parametrize(
    "data",
    [
        [],
        {"cluster": "x", "epoch": 1, "members": [{"peer_id": "a", "address": "h:1"}]},
        {"cluster": CLUSTER, "epoch": 0, "members": [{"peer_id": "a", "address": "h:1"}]},
        {"cluster": CLUSTER, "epoch": True, "members": [{"peer_id": "a", "address": "h:1"}]},
        {"cluster": CLUSTER, "epoch": 2**53, "members": [{"peer_id": "a", "address": "h:1"}]},
        {"cluster": CLUSTER, "epoch": 1, "members": []},
        {"cluster": CLUSTER, "epoch": 1, "members": [{"peer_id": "a b", "address": "h:1"}]},
        {"cluster": CLUSTER, "epoch": 1, "members": [{"peer_id": "a", "address": "h:99999"}]},
        {"cluster": CLUSTER, "epoch": 1, "members": [{"peer_id": "a", "address": "h:1"}] * 2},
        {"cluster": CLUSTER, "epoch": 1, "members": ["a"]},
    ],
)
def test_malformed_configurations_are_refused(data: object) -> None:
    with pytest.raises(ProtocolError):
        Configuration.from_json(data)


def test_malformed_answers_and_suspects_are_refused() -> None:
    current = config(5, 1, 2)
    with pytest.raises(ProtocolError):  # a "recent" configuration after the current one
        parse_cluster_answer({"current": current.to_json(), "recent": [config(6, 1).to_json()]})
    with pytest.raises(ProtocolError):  # another cluster's
        other = config(4, 1, cluster="cd" * 16)
        parse_cluster_answer({"current": current.to_json(), "recent": [other.to_json()]})
    with pytest.raises(ProtocolError):
        parse_suspects({"down": ["ok", 3]})
    answer = ClusterAnswer(current, (config(4, 1),))
    assert parse_cluster_answer(json.loads(json.dumps(answer.to_json()))) == answer


@given(st.sets(st.integers(min_value=1, max_value=200), min_size=1, max_size=40), st.data())
def test_voters_depend_on_the_member_set_alone(indexes: set[int], data: st.DataObject) -> None:
    """Whatever the order members are given in and whatever the epoch, the voters are the
    same, at most VOTERS_MAX of the members; removing a non-voter keeps them."""
    ordered = sorted(indexes)
    shuffled = data.draw(st.permutations(ordered))
    one = config(1, *ordered)
    other = config(data.draw(st.integers(min_value=2, max_value=10**6)), *shuffled)
    assert one.voters() == other.voters()
    assert len(one.voters()) == min(VOTERS_MAX, len(ordered))
    assert set(one.voters()) <= set(one.members)
    outsiders = [m for m in one.members if m not in one.voters()]
    if outsiders:
        assert one.without([outsiders[0].peer_id]).voters() == one.voters()


async def opened(tmp_path: Path, me: str = "peer-1") -> Metadata:
    (tmp_path / "tmp").mkdir(parents=True, exist_ok=True)
    held = Metadata(tmp_path, me)
    held.open()
    return held


async def test_a_peer_learns_forward_only_and_never_another_cluster(tmp_path: Path) -> None:
    held = await opened(tmp_path)
    seen: list[tuple[int, bool]] = []
    held.listeners.append(lambda c, gap: seen.append((c.epoch, gap)))
    assert await held.learn([config(1, 1)])
    assert await held.learn([config(3, 1, 2, 3), config(2, 1, 2)])  # out of order: sorted
    assert not await held.learn([config(2, 1, 2)])  # older: ignored
    assert await held.learn([config(5, 1, 2)])  # epoch 4 missed
    assert seen == [(1, False), (2, False), (3, False), (5, True)]
    assert [c.epoch for c in held.recent] == [1, 2, 3]
    with pytest.raises(ProtocolError):
        await held.learn([config(6, 1, cluster="cd" * 16)])
    assert held.epoch == 5
    again = await opened(tmp_path)  # what it learned is saved
    assert again.answer() == held.answer()


async def test_the_vote_for_the_next_epoch_follows_paxos_and_survives_restart(
    tmp_path: Path,
) -> None:
    """Breaks: prepares and accepts for epoch 2 at various ballots, a restart between
    them. Must hold: a lower ballot is pre-empted naming the higher; the value accepted
    is what the next prepare returns, also after a restart; a round for an epoch decided
    already gets the decided configuration, one for an epoch too far gets the peer's
    epoch, and a non-voter says so."""
    held = await opened(tmp_path)
    assert isinstance(await held.prepare(2, Ballot(1, "aa")), Unready)
    await held.learn([config(1, 1, 2, 3)])
    high, low = Ballot(5, "aa"), Ballot(3, "bb")
    assert isinstance(await held.prepare(2, high), Slot)
    refused = await held.prepare(2, low)
    assert isinstance(refused, Preempted) and refused.promised == high
    proposal = config(2, 1, 2, 3, 4)
    assert isinstance(await held.accept(2, high, proposal), Slot)
    restarted = await opened(tmp_path)
    promise = await restarted.prepare(2, Ballot(6, "cc"))
    assert isinstance(promise, Slot) and promise.accepted == high
    assert Configuration.decode(promise.value.data) == proposal
    await restarted.learn([proposal])
    decided = await restarted.prepare(2, Ballot(7, "cc"))
    assert isinstance(decided, Decided) and decided.current.current == proposal
    far = await restarted.prepare(9, Ballot(7, "cc"))
    assert isinstance(far, Unready) and far.epoch == 2
    with pytest.raises(ProtocolError):  # a value that does not decide the epoch asked
        await restarted.accept(3, Ballot(8, "cc"), config(4, 1, 2))
    outsider = await opened(tmp_path / "other", "peer-9")
    await outsider.learn([config(1, 1, 2, 3)])
    assert isinstance(await outsider.prepare(2, Ballot(1, "aa")), NotVoter)


async def test_a_full_disk_spends_the_reserve_to_vote_and_takes_it_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Breaks: the acceptor state cannot be written (disk full) once. Must hold: the
    reserve gives room and the vote is answered and saved; the reserve is whole again
    once there is room; with the reserve spent, the vote is refused (StorageFull)."""
    import ring.metadata as metadata_module
    from ring.errors import StorageFull

    held = await opened(tmp_path)
    await held.learn([config(1, 1, 2, 3)])
    reserve = tmp_path / "cluster" / "reserve"
    whole = reserve.stat().st_size
    real = metadata_module.write_file_atomic
    failures = {"left": 1}

    def flaky(tmp_dir: Path, final: Path, data: bytes) -> None:
        if final.name == "next.slot" and failures["left"] > 0:
            failures["left"] -= 1
            raise StorageFull("no space left on device (test)")
        real(tmp_dir, final, data)

    monkeypatch.setattr(metadata_module, "write_file_atomic", flaky)
    assert isinstance(await held.prepare(2, Ballot(1, "aa")), Slot)
    assert reserve.stat().st_size < whole
    await held.save_pending()
    assert reserve.stat().st_size == whole
    reserve.unlink()
    failures["left"] = 1
    with pytest.raises(StorageFull):
        await held.prepare(2, Ballot(2, "aa"))
