"""The overlay's asyncio shell: the UDP protocol that kademlia's lookups run on.

``OverlayProtocol`` is kademlia's ``KademliaProtocol`` with the unsafe parts of rpcudp
replaced: incoming datagrams go through ``ring.overlay_wire`` (authenticate and check
their signed addresses, then queue; decode and dispatch from an explicit table), outgoing
calls are explicit methods that record the answer they expect and whom they asked, every
datagram sent is sealed with this node's address and its destination, and background
work runs as bounded, tracked tasks that ``close`` cancels and awaits. Decisions about
values and routing come from ``ring.overlay_table``.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, cast

from kademlia.node import Node
from kademlia.protocol import KademliaProtocol
from rpcudp.protocol import RPCProtocol

from ring.overlay_table import BoundedRoutingTable, BoundedStorage, hands_over
from ring.overlay_wire import (
    DATAGRAM_DROP_REASONS,
    MESSAGE_ID_BYTES,
    RESPONSE_CHECKS,
    Address,
    DatagramGate,
    Dropped,
    Request,
    Response,
    pack_address,
    parse_message,
    request_payload,
    response_payload,
    seal,
)

__all__ = [
    "DROP_REASONS",
    "INBOX_DATAGRAMS_MAX",
    "OUTSTANDING_REQUESTS_MAX",
    "TASKS_MAX",
    "Address",
    "CallResult",
    "OverlayProtocol",
]

log = logging.getLogger(__name__)

INBOX_DATAGRAMS_MAX = 1024
TASKS_MAX = 64
OUTSTANDING_REQUESTS_MAX = 1024

# "tasks_full": a hand-over store or a bucket-head ping not started (task set full).
DROP_REASONS = (*DATAGRAM_DROP_REASONS, "tasks_full")

CallResult = tuple[bool, Any]  # kademlia's (answered, body) convention


class _SigningTransport:
    """The transport that rpcudp and kademlia see: every datagram they send is sealed,
    signed as sent from ``source`` (this node's advertised address) to its destination."""

    def __init__(
        self,
        transport: asyncio.DatagramTransport,
        key: bytes,
        clock: Callable[[], float],
        source: Address,
    ) -> None:
        self._transport = transport
        self._key = key
        self._clock = clock
        self._source = source

    def sendto(self, payload: bytes, address: Address) -> None:
        datagram = seal(self._key, int(self._clock()), self._source, address, payload)
        self._transport.sendto(datagram, address)


async def _run_job(job: Callable[..., Awaitable[object]], arguments: tuple[Any, ...]) -> None:
    await job(*arguments)


class OverlayProtocol(KademliaProtocol):  # type: ignore[misc]
    """KademliaProtocol with an authenticated datagram path and explicit dispatch.

    ``datagram_received`` only authenticates and queues; ``serve`` (run by
    ``Overlay.run``) decodes, dispatches and answers. Outgoing calls are explicit methods
    (rpcudp's ``__getattr__`` closures are never used), so each records the method it
    expects an answer to.
    """

    def __init__(
        self,
        node: Any,
        storage: BoundedStorage,
        *,
        key: bytes,
        clock: Callable[[], float],
        ksize: int,
        rpc_timeout_s: float,
    ) -> None:
        RPCProtocol.__init__(self, wait_timeout=rpc_timeout_s)
        self.transport: _SigningTransport | None = None
        self.router = BoundedRoutingTable(self, ksize, node)
        self.storage = storage
        self.source_node = node
        self.handled = 0
        self.dropped: dict[str, int] = dict.fromkeys(DROP_REASONS, 0)
        self._key = key
        self._clock = clock
        self._inbox: asyncio.Queue[tuple[bytes, Address]] = asyncio.Queue(INBOX_DATAGRAMS_MAX)
        self._gate = DatagramGate(key)
        # Every address this node admits datagrams signed for (set_addresses).
        self._own_addresses: frozenset[Address] = frozenset()
        self._expected: dict[bytes, tuple[str, Address]] = {}  # method, whom we asked
        self._tasks: set[asyncio.Task[None]] = set()
        self._socket: asyncio.DatagramTransport | None = None
        self._lost: asyncio.Future[None] | None = None
        self._closing = False
        self._handlers: dict[str, Callable[..., object]] = {
            "ping": self.rpc_ping,
            "store": self.rpc_store,
            "find_node": self.rpc_find_node,
            "find_value": self.rpc_find_value,
        }

    # transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A datagram endpoint's transport (on 3.11 not a DatagramTransport subclass).
        # Nothing is sent (nor admitted: no own address yet) until ``set_addresses``.
        self._socket = cast(asyncio.DatagramTransport, transport)
        self._lost = asyncio.get_running_loop().create_future()

    def set_addresses(self, advertised: Address, own_addresses: frozenset[Address]) -> None:
        """Sign datagrams as from ``advertised``; admit those signed for ``own_addresses``."""
        assert advertised in own_addresses, (advertised, own_addresses)
        assert self._socket is not None and self.transport is None, "set once, after binding"
        pack_address(advertised)  # an IPv4 address and a port, or a bug
        self._own_addresses = own_addresses
        self.transport = _SigningTransport(self._socket, self._key, self._clock, advertised)

    def own_addresses(self) -> frozenset[Address]:
        return self._own_addresses

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(None)

    def local_address(self) -> Address | None:
        if self._socket is None:
            return None
        host, port = self._socket.get_extra_info("sockname")[:2]
        return (str(host), int(port))

    def datagram_received(self, data: bytes, addr: Address) -> None:
        # Replaces rpcudp's version (an ensure_future per datagram): authenticate, queue.
        came_from = (str(addr[0]), int(addr[1]))
        try:
            admitted = self._gate.admit(data, came_from, self._own_addresses, self._clock())
            self._inbox.put_nowait((admitted.payload, admitted.source))
        except Dropped as exc:
            self._drop(exc.reason)
        except asyncio.QueueFull:
            self._drop("queue_full")

    def _drop(self, reason: str) -> None:
        log.debug("overlay dropped: %s", reason)
        self.dropped[reason] += 1

    # incoming messages

    async def serve(self) -> None:
        while True:
            payload, sender = await self._inbox.get()
            self.handle(payload, sender)
            # get() does not yield while the queue holds a backlog; let other work run.
            await asyncio.sleep(0)

    def handle(self, payload: bytes, sender: Address) -> None:
        """Process one authenticated payload: answer a request or settle a call."""
        try:
            message = parse_message(payload)
            if isinstance(message, Request):
                self._answer(message, sender)
            else:
                self._settle(message, sender)
        except Dropped as exc:
            self._drop(exc.reason)
            return
        self.handled += 1

    def _answer(self, request: Request, sender: Address) -> None:
        answer = self._handlers[request.method](sender, *request.arguments)
        reply = response_payload(request.message_id, request.method, answer)
        if self.transport is not None:
            self.transport.sendto(reply, sender)

    def _settle(self, response: Response, sender: Address) -> None:
        expected = self._expected.pop(response.message_id, None)
        pending = self._outstanding.get(response.message_id)
        if expected is None or pending is None or pending[0].done():
            self._finish(response.message_id, (False, None))  # e.g. its caller gave up
            raise Dropped("unexpected_response")
        method, asked = expected
        if pack_address(sender) != pack_address(asked):
            # Answered from an address other than the one asked (and signed as such):
            # the caller would learn the contact at an address it never signed.
            self._finish(response.message_id, (False, None))
            raise Dropped("wrong_source")
        if not RESPONSE_CHECKS[method](response.body):
            self._finish(response.message_id, (False, None))
            raise Dropped("bad_response")
        self._accept_response(response.message_id, response.body, sender)

    def rpc_store(self, sender: Address, nodeid: bytes, key: bytes, value: bytes) -> bool:
        self.welcome_if_new(Node(nodeid, sender[0], sender[1]))
        return self.storage.put(key, value)

    def welcome_if_new(self, node: Any) -> None:
        """Add a new node to the routing table and hand it the values it should hold.

        Upstream fires the hand-over stores with ensure_future, hashes the (already
        hashed) key again when picking them, and hands over to nodes that only make the
        replacement cache; here they are tracked tasks, for admitted nodes only.
        """
        if node.id == self.source_node.id or not self.router.is_new_node(node):
            return
        handover = [(key, value) for key, value in self.storage if self._hands_over(key, node)]
        self.router.add_contact(node)
        if self.router.is_new_node(node):
            return
        for key, value in handover:
            self.spawn(self.call_store, node, key, value)

    def _hands_over(self, key: bytes, node: Any) -> bool:
        key_node = Node(key)
        neighbors = self.router.find_neighbors(key_node)
        return hands_over(key_node, node, self.source_node, neighbors)

    # outgoing calls

    def ping(self, address: Address, node_id: bytes) -> asyncio.Future[CallResult]:
        return self._call(address, "ping", node_id)

    def store(
        self, address: Address, node_id: bytes, key: bytes, value: bytes
    ) -> asyncio.Future[CallResult]:
        return self._call(address, "store", node_id, key, value)

    def find_node(self, address: Address, node_id: bytes, key: bytes) -> asyncio.Future[CallResult]:
        return self._call(address, "find_node", node_id, key)

    def find_value(
        self, address: Address, node_id: bytes, key: bytes
    ) -> asyncio.Future[CallResult]:
        return self._call(address, "find_value", node_id, key)

    def _call(self, address: Address, method: str, *arguments: bytes) -> asyncio.Future[CallResult]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[CallResult] = loop.create_future()
        # Unpredictable, not from the injected generator: it is what ties an answer to us.
        message_id = secrets.token_bytes(MESSAGE_ID_BYTES)
        payload = request_payload(message_id, method, arguments)
        if self.transport is None or self._closing:
            future.set_result((False, None))
            return future
        if len(self._outstanding) >= OUTSTANDING_REQUESTS_MAX:
            log.warning(
                "overlay: %d requests in flight; %s to %s not sent",
                len(self._outstanding),
                method,
                address,
            )
            future.set_result((False, None))
            return future
        self.transport.sendto(payload, address)
        timer = loop.call_later(self._wait_timeout, self._timeout, message_id)
        self._outstanding[message_id] = (future, timer)
        self._expected[message_id] = (method, address)
        return future

    def _timeout(self, msg_id: bytes) -> None:
        log.debug("overlay: no answer within %.1f s", self._wait_timeout)
        self._finish(msg_id, (False, None))

    def _finish(self, message_id: bytes, result: CallResult) -> None:
        self._expected.pop(message_id, None)
        pending = self._outstanding.pop(message_id, None)
        if pending is None:
            return
        future, timer = pending
        timer.cancel()
        if not future.done():
            future.set_result(result)

    # background work and shutdown

    def spawn(self, job: Callable[..., Awaitable[object]], *arguments: Any) -> None:
        """Run ``job(*arguments)`` as a tracked task, unless TASKS_MAX are running."""
        if self._closing:
            return
        if len(self._tasks) >= TASKS_MAX:
            self._drop("tasks_full")
            return
        task = asyncio.get_running_loop().create_task(_run_job(job, arguments))
        self._tasks.add(task)
        task.add_done_callback(self._job_done)

    def _job_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("overlay background job failed", exc_info=task.exception())

    async def close(self) -> None:
        """Cancel background jobs, fail calls in flight, close the socket. Idempotent."""
        self._closing = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for message_id in list(self._outstanding):
            self._finish(message_id, (False, None))
        if self._socket is not None and self._lost is not None:
            self._socket.close()
            await self._lost
