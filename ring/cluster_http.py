"""The server side of the cluster metadata routes (``ring.api`` CLUSTER*, bodies in
``ring.cluster``): a peer serves its configuration, learns decided ones, votes in the
rounds that decide the next epoch, and says whom it does not hear from.

Each handler is a thin shell over ``ring.metadata`` and the member table; errors are the
peer's JSON errors (``Peer.guard``), refusals of a round a 409 naming what the proposer
needs: the ballot promised, the configuration already decided, or the epoch this peer is
at.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from ring import api, paxos
from ring.cluster import Configuration, parse_cluster_answer, suspects_body
from ring.errors import ProtocolError
from ring.metadata import Decided, Metadata, NotVoter, Unready
from ring.paxos import Ballot, Preempted, Slot
from ring.peer_answers import body_of
from ring.steward import Steward

__all__ = ["cluster_routes"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _epoch_query(request: web.Request) -> int:
    return api.parse_int(request.query.get("epoch"), "epoch", None, api.VERSION_MAX)


def _refusal(outcome: Decided | Unready | NotVoter | Preempted) -> web.Response:
    if isinstance(outcome, Preempted):
        body = api.error_body(
            "preempted", f"ballot {outcome.promised.wire()} was promised here",
            promised=outcome.promised.wire(),
        )  # fmt: skip
    elif isinstance(outcome, Decided):
        body = api.error_body(
            "epoch_decided",
            f"epoch {outcome.current.current.epoch} is decided here",
            cluster=outcome.current.to_json(),
        )
    elif isinstance(outcome, Unready):
        body = api.error_body(
            "epoch_unready", f"this peer is at epoch {outcome.epoch}", epoch=outcome.epoch
        )
    else:
        body = api.error_body(
            "not_voter",
            f"this peer is not a voter of epoch {outcome.epoch}",
            epoch=outcome.epoch,
        )
    return web.json_response(body, status=409)


class _ClusterHandlers:
    def __init__(self, metadata: Metadata, steward: Steward) -> None:
        self.metadata = metadata
        self.steward = steward

    async def get(self, _request: web.Request) -> web.Response:
        answer = self.metadata.answer()
        if answer is None:
            body = api.error_body("not_ready", "this peer has not learned a configuration yet")
            return web.json_response(body, status=503)
        return web.json_response(answer.to_json())

    async def learn(self, request: web.Request) -> web.Response:
        answer = parse_cluster_answer(api.parse_json_object(body_of(request)))
        await self.metadata.learn_answer(answer)
        return web.json_response({"epoch": self.metadata.epoch})

    async def prepare(self, request: web.Request) -> web.Response:
        epoch, ballot = _epoch_query(request), Ballot.parse(request.query.get("ballot"))
        if ballot == paxos.FAST:
            raise ProtocolError("configuration rounds take classic ballots only")
        outcome = await self.metadata.prepare(epoch, ballot)
        if not isinstance(outcome, Slot):
            return _refusal(outcome)
        return web.Response(
            body=paxos.encode_slot(outcome), content_type="application/octet-stream"
        )

    async def accept(self, request: web.Request) -> web.Response:
        epoch, ballot = _epoch_query(request), Ballot.parse(request.query.get("ballot"))
        if ballot == paxos.FAST:
            raise ProtocolError("configuration rounds take classic ballots only")
        config = Configuration.decode(body_of(request))
        outcome = await self.metadata.accept(epoch, ballot, config)
        if not isinstance(outcome, Slot):
            return _refusal(outcome)
        return web.json_response({"accepted": ballot.wire()})

    async def suspects(self, _request: web.Request) -> web.Response:
        down = self.steward.table.suspects()
        return web.json_response(suspects_body(self.metadata.epoch, down))


def cluster_routes(metadata: Metadata, steward: Steward) -> dict[api.Route, Handler]:
    handlers = _ClusterHandlers(metadata, steward)
    return {
        api.CLUSTER: handlers.get,
        api.CLUSTER_LEARN: handlers.learn,
        api.CLUSTER_PREPARE: handlers.prepare,
        api.CLUSTER_ACCEPT: handlers.accept,
        api.CLUSTER_SUSPECTS: handlers.suspects,
    }
