"""Catching up on every record after an epoch change (``ring.settle``): when a peer may
say it caught up, and when it must not.

A stand-in acceptor (the rings, which keys need a catch-up, whether one succeeds) and a
transport answering scan pages as peers would: the rule under test is the settler's,
not the records' (``test_cluster_ring.py`` runs it on real peers).
"""

from __future__ import annotations

import json
from typing import Any, cast

from ring import api, records_api
from ring.cluster import Configuration
from ring.consensus import Acceptor, Syncing
from ring.errors import PeerUnavailable
from ring.membership import Entry, MemberTable
from ring.placement import Member, Ring
from ring.settle import Settler
from ring.transport import Response, Transport

GROUP = 5


def member(peer_id: str) -> Member:
    return Member(peer_id, f"10.0.0.{int(peer_id[1:])}:7401")


def ring(*peer_ids: str) -> Ring:
    return Ring.build([member(p) for p in peer_ids], vnodes=8)


class StandIn:
    """What the settler asks of an acceptor."""

    def __init__(self, history: list[Ring | None], current: Ring, failing: set[str]) -> None:
        self._history, self._current, self.failing = history, current, failing
        self.caught_up: list[str] = []
        self.covered_epoch = -1

    def history(self) -> list[Ring | None]:
        return self._history

    def ring(self) -> Ring:
        return self._current

    def needs_catch_up(self, key: str) -> bool:
        return key not in self.caught_up

    async def catch_up(self, key: str) -> None:
        if key in self.failing:
            raise Syncing(f"record {key!r}: could not hear from enough peers")
        self.caught_up.append(key)

    def cover(self, epoch: int) -> None:
        self.covered_epoch = epoch


class Peers(Transport):
    """Scan pages: each peer lists ``keys`` at ``epochs[peer]``; absent peers refuse."""

    def __init__(
        self, keys: list[str], epochs: dict[str, int], extra: dict[str, list[str]] | None = None
    ) -> None:
        super().__init__("s" * 32)
        self.keys, self.epochs, self.extra = keys, epochs, extra or {}

    async def request(self, address: str, method: str, path_qs: str, **options: Any) -> Response:
        peer_id = "p" + address.split(":", maxsplit=1)[0].rsplit(".", 1)[1]
        if peer_id not in self.epochs:
            raise PeerUnavailable(address, "connection refused")
        keys = sorted([*self.keys, *self.extra.get(peer_id, [])])
        records = [records_api.ScanRecord(key, 1, "2.ab", "01", False, b"", True) for key in keys]
        page = records_api.ScanAnswer(tuple(records), (), False, keys[-1], "d" * 16, True)
        body = json.dumps(records_api.scan_answer(page)).encode()
        return Response(200, {api.HEADER_EPOCH: str(self.epochs[peer_id])}, body)


def settler(acceptor: StandIn, transport: Transport, epoch: int) -> tuple[Settler, MemberTable]:
    table = MemberTable(Entry("p1", "10.0.0.1:7401", "", "up", 1, 0), lambda: 0.0)
    current = acceptor.ring()
    table.configuration = Configuration("c" * 16, epoch, current.members)
    s = Settler("p1", cast(Acceptor, acceptor), lambda: table, transport, lambda: epoch, GROUP)
    return s, table


KEYS = [f"k/{n}" for n in range(40)]
FORMED = [ring("p2"), ring("p2", "p3"), ring("p1", "p2", "p3", "p4")]
NOW = ring("p1", "p2", "p3", "p4", "p5")


async def test_a_peer_that_caught_up_on_every_listed_key_says_so() -> None:
    """Breaks: nothing; every peer answers at the epoch. Must hold: every key this peer
    answers for is caught up on, it covers the epoch and announces it."""
    acceptor = StandIn(list(FORMED), NOW, set())
    peers = Peers(KEYS, {p: 4 for p in ("p2", "p3", "p4", "p5")})
    s, table = settler(acceptor, peers, 4)
    await s.step()
    mine = [k for k in KEYS if any(m.peer_id == "p1" for m in NOW.preference_list(k, GROUP))]
    assert set(acceptor.caught_up) == set(mine)  # (several peers list a key: once each)
    assert acceptor.covered_epoch == 4 and table.own.settled == 4


async def test_one_key_that_cannot_catch_up_keeps_the_epoch_uncovered() -> None:
    """Breaks: the catch-up of a key only p5 lists fails (503 syncing); p5 is in no old
    group, so the others cover every old group without it. Must hold: the peer does not
    cover the epoch nor announce it, although every peer listed its records."""
    acceptor = StandIn(list(FORMED), NOW, {"k/p5-only"})
    epochs = {p: 4 for p in ("p2", "p3", "p4", "p5")}
    s, table = settler(acceptor, Peers(KEYS, epochs, {"p5": ["k/p5-only"]}), 4)
    await s.step()
    assert acceptor.covered_epoch == -1 and table.own.settled == 0


async def test_the_only_member_of_an_old_group_must_answer_at_the_epoch() -> None:
    """Breaks: p2, alone in the first ring, is down; then it answers, but at an older
    epoch (it may still accept that epoch's rounds). Must hold: neither covers; once it
    answers at the epoch, the pass covers."""
    acceptor = StandIn(list(FORMED), NOW, set())
    s, _table = settler(acceptor, Peers(KEYS, {p: 4 for p in ("p3", "p4", "p5")}), 4)
    assert not await s.settle(4)
    s, _table = settler(acceptor, Peers(KEYS, {"p2": 3, "p3": 4, "p4": 4, "p5": 4}), 4)
    assert not await s.settle(4)
    s, _table = settler(acceptor, Peers(KEYS, {"p2": 5, "p3": 4, "p4": 4, "p5": 4}), 4)
    assert await s.settle(4)


async def test_a_majority_of_each_old_group_suffices() -> None:
    """Breaks: the ring before had five members; two of the four others are down. Must
    hold: the three that answer (with this peer) are a majority of every old group."""
    acceptor = StandIn([ring("p1", "p2", "p3", "p4", "p6")], NOW, set())
    s, _table = settler(acceptor, Peers(KEYS, {"p2": 4, "p3": 4}), 4)
    assert await s.settle(4)
    s, _table = settler(acceptor, Peers(KEYS, {"p2": 4}), 4)
    assert not await s.settle(4)
