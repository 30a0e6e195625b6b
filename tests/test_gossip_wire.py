"""What a gossip exchange carries (``ring.gossip_wire``): a digest and one byte of age per
peer while the tables agree, whole tables only when they differ.

Two real ``Gossiper`` objects exchange through a transport that hands one's request to
the other's ``receive`` (the HTTP layer is not what is under test; ``test_gossip.py``
and every cluster test run it over real sockets). Clocks are stepped by hand.
"""

from __future__ import annotations

import base64
import json
import random
from typing import Any

import pytest

from ring import api
from ring.errors import ProtocolError
from ring.gossip import Gossiper
from ring.gossip_wire import AGE_NONE, decode_message, encode_ages, table_digest
from ring.membership import MEMBERS_MAX, Entry, MemberTable
from ring.transport import Response, Transport


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def entry(peer_id: str, status: str = "up", heartbeat: int = 0) -> Entry:
    return Entry(peer_id, f"10.0.0.{int(peer_id[1:])}:7401", "", status, 1, heartbeat)


class Wire(Transport):
    """Delivers each gossip request to the partner's ``receive`` at once."""

    def __init__(self) -> None:
        super().__init__("s" * 32)
        self.partners: dict[str, Gossiper] = {}
        self.sent: list[dict[str, Any]] = []

    async def request(self, address: str, method: str, path_qs: str, **options: Any) -> Response:
        body = options["body"]
        self.sent.append(json.loads(body))
        answer = self.partners[address].receive(body)
        self.sent.append(json.loads(answer))
        return Response(200, {}, answer)


def gossiper(me: str, others: list[str], clock: Clock, wire: Wire) -> Gossiper:
    table = MemberTable(entry(me), clock)
    table.merge([entry(peer_id) for peer_id in others])
    g = Gossiper(
        table, wire, seeds=[], contacts=list, rng=random.Random(1), interval_s=1.0, clock=clock
    )
    wire.partners[table.own.address] = g
    return g


async def test_agreeing_tables_exchange_a_digest_and_ages_and_liveness_spreads() -> None:
    """Breaks: p1 and p2 hold the same five entries; p1 heard p3 0.25 s ago, p2 last 9 s
    ago; p5 went silent 20 s ago everywhere. Must hold: neither message carries the
    table; after one exchange p2 counts p3 as heard 0.3 s ago (rounded up to a tenth),
    p5 stays silent (an older age never refreshes), and p1 learns how recently p2 heard
    from p4."""
    clock, wire = Clock(), Wire()
    ids = ["p1", "p2", "p3", "p4", "p5"]
    a = gossiper("p1", ids[1:], clock, wire)
    b = gossiper("p2", ["p1", *ids[2:]], clock, wire)
    clock.now += 20.0
    a.table.heard("p3", 0.25)
    b.table.heard("p3", 9.0)
    b.table.heard("p4", 1.0)
    a.table.heard("p4", 7.0)
    assert await a.exchange(b.table.own.address)
    assert [("members" in m) for m in wire.sent] == [False, False]
    assert b.table.silent_s("p3") == pytest.approx(0.3)
    assert a.table.silent_s("p4") == pytest.approx(1.0)
    assert a.table.silent_s("p5") == pytest.approx(20.0)
    assert b.table.silent_s("p5") == pytest.approx(20.0)
    assert a.ready.is_set() is False  # no configuration learned: not ready on agreement alone


async def test_differing_tables_trade_whole_tables_and_then_agree() -> None:
    """Breaks: p1 knows p3 joined and that p4 is leaving; p2 knows neither. Must hold:
    p2 answers p1's digest with its table and asks for p1's; p1 sends it; afterwards both
    tables hold the same entries (equal digests), and the next exchange is small again."""
    clock, wire = Clock(), Wire()
    a = gossiper("p1", ["p2", "p3"], clock, wire)
    b = gossiper("p2", ["p1", "p4"], clock, wire)
    a.table.merge([entry("p4", "leaving", heartbeat=5)])
    assert await a.exchange(b.table.own.address)
    assert [("members" in m, m.get("want", False)) for m in wire.sent] == [
        (False, False), (True, True), (True, False), (False, False),
    ]  # fmt: skip
    assert table_digest(a.table.entries()) == table_digest(b.table.entries())
    assert b.table.entry("p3") is not None and b.table.entry("p4").status == "leaving"  # type: ignore[union-attr]
    wire.sent.clear()
    assert await b.exchange(a.table.own.address)
    assert [("members" in m) for m in wire.sent] == [False, False]


async def test_a_dead_peer_s_last_heartbeat_relayed_late_keeps_its_age() -> None:
    """Breaks: p3 dies; its last heartbeat reached p1 but not p2 (p2 holds the one
    before: heartbeats alone do not make digests differ, so tables are not traded for
    them). Twelve seconds later p4 starts leaving, so p1 and p2 trade whole tables. Must
    hold: p2 takes p3's newer entry with p1's age for it, so p3 is still 12 s silent at
    p2, not heard from just now (a dead peer shown alive, or joining once removed, for a
    failure timeout, whenever some other entry changes)."""
    clock, wire = Clock(), Wire()
    a = gossiper("p1", ["p2", "p4"], clock, wire)
    b = gossiper("p2", ["p1", "p4"], clock, wire)
    b.table.merge([entry("p3", heartbeat=4)])
    a.table.merge([entry("p3", heartbeat=5)])
    clock.now += 12.0
    a.table.merge([entry("p4", "leaving", heartbeat=1)])
    assert await a.exchange(b.table.own.address)
    assert b.table.entry("p4").status == "leaving"  # type: ignore[union-attr]
    assert b.table.entry("p3") == entry("p3", heartbeat=5)
    assert b.table.silent_s("p3") == pytest.approx(12.0, abs=0.1)


async def test_a_peer_before_digests_is_answered_with_whole_tables() -> None:
    """Breaks: a partner of the earlier format sends ``members`` only. Must hold: its
    entries are merged and the answer is the whole table in that format."""
    clock, wire = Clock(), Wire()
    b = gossiper("p2", ["p1"], clock, wire)
    old = {"members": [entry("p1").to_json(), entry("p7").to_json()], "cluster_epoch": 0}
    answer = json.loads(b.receive(json.dumps(old).encode()))
    assert "digest" not in answer and {m["peer_id"] for m in answer["members"]} == {
        "p1", "p2", "p7",
    }  # fmt: skip


def test_a_thousand_peers_gossip_in_about_a_kilobyte_and_a_half() -> None:
    """Must hold: with agreeing tables of 1,000 entries a message body is under 1.5 kB
    (the whole table is ~110 kB)."""
    entries = [entry(f"p{n}") for n in range(1, 1001)]
    body = json.dumps({
        "cluster_epoch": 7, "digest": table_digest(entries),
        "ages": base64.b64encode(encode_ages([0.5] * 1000)).decode(),
    }).encode()  # fmt: skip
    full = json.dumps(api.member_table_body(entries)).encode()
    assert len(body) < 1500 and len(full) > 100_000


def test_ages_round_up_to_tenths_and_saturate() -> None:
    assert list(encode_ages([0.0, 0.05, 0.1, 0.11, 25.3, 25.4, 99.0, None])) == [
        0, 1, 1, 2, 253, 254, AGE_NONE, AGE_NONE,
    ]  # fmt: skip


@pytest.mark.parametrize(
    "body",
    [
        {"digest": "zz", "ages": ""},
        {"digest": "0" * 16, "ages": "not base64!"},
        {"digest": "0" * 16, "ages": base64.b64encode(bytes(MEMBERS_MAX + 1)).decode()},
        {"digest": "0" * 16, "ages": base64.b64encode(bytes(3)).decode(),
         "members": [entry("p1").to_json()]},
        {"digest": "0" * 16, "ages": "", "want": "yes"},
        {"ages": ""},
    ],
)  # fmt: skip
def test_malformed_gossip_bodies_are_protocol_errors(body: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError):
        decode_message(body)
