"""When a joining peer is ready (``Gossiper.ready``): it then serves the ring to clients
and repairs on it, so its table must not be a part of the ring another joiner handed it.

A plain aiohttp server stands in for the gossip partner, answering ``POST /v1/gossip``
with scripted tables: what is under test is the joiner's rule, not the partner.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from ring.cluster import Configuration
from ring.gossip import Gossiper
from ring.membership import Entry, MemberTable
from ring.transport import Transport

SECRET = "s" * 32


def entry(peer_id: str) -> Entry:
    return Entry(peer_id, f"127.0.0.1:{7400 + int(peer_id[1:])}", "", "up", 1, 0)


class Partner:
    """Answers each exchange with the next scripted member list (ids)."""

    def __init__(self) -> None:
        self.script: list[list[str]] = []
        self.address = ""

    async def gossip(self, request: web.Request) -> web.Response:
        await request.read()
        members = [entry(peer_id).to_json() for peer_id in self.script.pop(0)]
        return web.json_response({"members": members})


@pytest.fixture
async def partner() -> AsyncIterator[Partner]:
    scripted = Partner()
    app = web.Application()
    app.router.add_post("/v1/gossip", scripted.gossip)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    scripted.address = f"127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield scripted
    finally:
        await runner.cleanup()


async def test_a_joiner_is_ready_only_once_a_partner_names_the_same_members(
    partner: Partner,
) -> None:
    """Breaks: a joiner p1 whose partner first knows p2 only, then also p3 (which joined
    meanwhile), then names the same members as p1, then fewer. Must hold: p1 is not
    ready after learning p2, nor after learning p3, nor while it has learned no
    configuration; it is ready after the exchange in which both tables name p1, p2 and
    p3 and it holds a configuration; an exchange that fails leaves it unready."""
    table = MemberTable(entry("p1"), lambda: 0.0)
    transport = Transport(SECRET)
    gossiper = Gossiper(
        table, transport, seeds=[partner.address], contacts=list,
        rng=random.Random(1), interval_s=1.0,
    )  # fmt: skip
    try:
        partner.script = [["p1", "p2"], ["p1", "p2", "p3"]]
        assert await gossiper.exchange(partner.address)
        assert not gossiper.ready.is_set()
        assert await gossiper.exchange(partner.address)
        assert not gossiper.ready.is_set()
        assert not await gossiper.exchange("127.0.0.1:9")  # nobody there
        assert not gossiper.ready.is_set()
        partner.script = [["p1", "p2"]]  # behind us: it learns p3 from us, we learn nothing
        assert await gossiper.exchange(partner.address)
        assert not gossiper.ready.is_set()
        partner.script = [["p1", "p2", "p3"]]
        assert await gossiper.exchange(partner.address)
        # Same members, but no configuration learned yet: nothing to place with.
        assert not gossiper.ready.is_set()
        table.configuration = Configuration("0" * 32, 1, (entry("p1").member,))
        partner.script = [["p1", "p2", "p3"]]
        assert await gossiper.exchange(partner.address)
        assert gossiper.ready.is_set()
        assert {e.peer_id for e in table.entries()} == {"p1", "p2", "p3"}
    finally:
        await transport.close()
