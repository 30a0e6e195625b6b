"""What an overlay node holds and decides, without sockets: values and routing choices.

The bounded value store (kademlia's ``IStorage``), the bounded set of values this node
announces itself, kademlia's routing table with a bucket-head ping that runs as a
tracked task, and the pure decisions of the Kademlia paper that the I/O shell
(``ring.overlay_protocol``, ``ring.overlay``) acts on: whom to hand a value over to,
which buckets to refresh and where, and whether to keep a copy of a published value.
Clocks and random generators are passed in.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol

from kademlia.routing import RoutingTable

from ring.overlay_wire import NODE_ID_BYTES, NODE_ID_MAX, is_node_id, is_value

__all__ = [
    "OWN_VALUES_MAX",
    "VALUES_MAX",
    "VALUE_TTL_REFRESHES",
    "BoundedStorage",
    "BoundedRoutingTable",
    "Bucket",
    "OwnValues",
    "hands_over",
    "keeps_own_copy",
    "stale_bucket_targets",
]

VALUES_MAX = 4096
OWN_VALUES_MAX = 64
# A value nobody re-announces is forgotten after this many refresh intervals.
VALUE_TTL_REFRESHES = 10


class BoundedStorage:
    """kademlia's storage interface (``IStorage``), bounded in entries and value size.

    Holds at most ``values_max`` values, forgetting the least recently stored first, and
    forgets a value ``ttl_s`` after it was last stored (by the injected clock).
    """

    def __init__(self, clock: Callable[[], float], values_max: int, ttl_s: float) -> None:
        self._data: OrderedDict[bytes, tuple[float, bytes]] = OrderedDict()
        self._clock = clock
        self._values_max = values_max
        self._ttl_s = ttl_s

    def put(self, key: bytes, value: bytes) -> bool:
        """Store ``value``; False (nothing stored) if it is not bytes within the limit."""
        if not (is_node_id(key) and is_value(value)):
            return False
        self._data.pop(key, None)
        self._data[key] = (self._clock(), value)
        while len(self._data) > self._values_max:
            self._data.popitem(last=False)
        return True

    def __setitem__(self, key: bytes, value: bytes) -> None:
        if not self.put(key, value):
            raise ValueError(f"refused to store {len(value)} bytes under a {len(key)}-byte key")

    def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        self._cull()
        entry = self._data.get(key)
        return default if entry is None else entry[1]

    def __getitem__(self, key: bytes) -> bytes:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        self._cull()
        # A snapshot: callers store while they iterate.
        return iter([(key, value) for key, (_, value) in self._data.items()])

    def __len__(self) -> int:
        self._cull()
        return len(self._data)

    def iter_older_than(self, seconds_old: float) -> list[tuple[bytes, bytes]]:
        born_before = self._clock() - seconds_old
        return [(key, value) for key, (born, value) in self._data.items() if born <= born_before]

    def _cull(self) -> None:
        expired_before = self._clock() - self._ttl_s
        while self._data:
            born, _ = next(iter(self._data.values()))
            if born > expired_before:
                return
            self._data.popitem(last=False)


class OwnValues:
    """The values this node announced (by hashed key), at most ``values_max``."""

    def __init__(self, values_max: int = OWN_VALUES_MAX) -> None:
        self._values: OrderedDict[bytes, bytes] = OrderedDict()
        self.values_max = values_max

    def remember(self, dkey: bytes, value: bytes) -> bytes | None:
        """Keep ``value`` as the newest; the key it forgot to stay in bounds, if any."""
        self._values.pop(dkey, None)
        self._values[dkey] = value
        if len(self._values) > self.values_max:
            forgotten, _ = self._values.popitem(last=False)
            return forgotten
        return None

    def get(self, dkey: bytes) -> bytes | None:
        return self._values.get(dkey)

    def items(self) -> list[tuple[bytes, bytes]]:
        """A snapshot, oldest first."""
        return list(self._values.items())


class BoundedRoutingTable(RoutingTable):  # type: ignore[misc]
    """kademlia's routing table; the ping of a full bucket's head runs as a tracked task.

    ``protocol`` is the overlay's protocol: its ``spawn`` runs a bounded, tracked task.
    """

    def add_contact(self, node: Any) -> None:
        index = self.get_bucket_for(node)
        bucket = self.buckets[index]
        if bucket.add_node(node):
            return
        # Section 4.2 of the paper: split when the bucket covers our own id, or when its
        # depth is not a multiple of 5; otherwise keep the node as a replacement.
        if bucket.has_in_range(self.node) or bucket.depth() % 5 != 0:
            self.split_bucket(index)
            self.add_contact(node)
            return
        # The ping runs as a tracked task (spawn: bounded, awaited on close). A head that
        # does not answer is removed by handle_call_response, and a replacement takes
        # its place.
        self.protocol.spawn(self.protocol.call_ping, bucket.head())


class Bucket(Protocol):
    """What the refresh decision reads of a kademlia bucket."""

    last_updated: float
    range: tuple[int, int]


def hands_over(key_node: Any, new_node: Any, own_node: Any, neighbors: Sequence[Any]) -> bool:
    """Whether this node tells ``new_node`` the value under ``key_node``'s id.

    Section 2.5 of the paper: when the new node is closer to the key than the farthest
    of its k known holders (``neighbors``, nearest first) and this node is the closest.
    """
    if not neighbors:
        return True
    farthest = neighbors[-1].distance_to(key_node)
    closest = neighbors[0].distance_to(key_node)
    new_is_close = new_node.distance_to(key_node) < farthest
    return bool(new_is_close and own_node.distance_to(key_node) < closest)


def stale_bucket_targets(
    buckets: Iterable[Bucket], stale_before: float, rng: random.Random
) -> list[bytes]:
    """A random id within each bucket not updated since ``stale_before``, in order."""
    targets = []
    for bucket in buckets:
        if bucket.last_updated < stale_before:
            low, high = bucket.range
            target = min(rng.randint(low, high), NODE_ID_MAX)
            targets.append(target.to_bytes(NODE_ID_BYTES, "big"))
    return targets


def keeps_own_copy(own_node: Any, target: Any, nodes: Sequence[Any], ksize: int) -> bool:
    """Whether a node publishing ``target``'s value stores it too.

    It does when fewer than ``ksize`` nodes were found, or when it is closer to the key
    than the farthest of them.
    """
    farthest = max((node.distance_to(target) for node in nodes), default=0)
    return len(nodes) < ksize or own_node.distance_to(target) < farthest
