"""Recovery plans: who sends which chunks to whom. Pure functions of values.

A recovery fetches every chunk of a manifest to a requester. A plan is a forest of
``PlanNode``: each node is a peer that sends its ``own`` chunks plus everything its
``upstreams`` send it, as one stream, to its parent (or, for a root, to the requester).

* **star**: one root per holder, no upstreams: the requester pulls from every holder in
  parallel (fan-in = number of holders, capped by ``connections_max``).
* **line**: one root; each node has one upstream: the chain's first peer sends to the
  second, which appends its own chunks and forwards, and so on; only the last sends to
  the requester (fan-in 1 everywhere).
* **tree**: one root; each node has up to ``fan_in`` upstreams (a k-ary tree, depth
  about log_k of the holders); the root delivers to the requester.

Chunks are assigned to one live holder each, balancing bytes across holders (greedy,
largest chunk first, to the least loaded of its holders; ties by preference order).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ring.errors import DataUnavailable, ProtocolError

__all__ = [
    "TOPOLOGIES",
    "ChunkSpec",
    "Plan",
    "PlanNode",
    "Topology",
    "assign",
    "build_plan",
    "plan_line",
    "plan_star",
    "parse_topology",
    "plan_tree",
    "tree_depth",
]

Topology = Literal["star", "line", "tree"]
TOPOLOGIES: tuple[Topology, ...] = ("star", "line", "tree")
PLAN_DEPTH_MAX = 64
PLAN_NODES_MAX = 1024


@dataclass(frozen=True, slots=True)
class ChunkSpec:
    """A chunk to recover: its stored size and its live holders, preferred first."""

    chunk_id: str
    stored_bytes: int
    holders: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PlanNode:
    peer_id: str
    own: tuple[str, ...]
    upstreams: tuple[PlanNode, ...] = ()

    def chunk_ids(self) -> Iterator[str]:
        """Every chunk this node's stream carries (its own and its upstreams')."""
        yield from self.own
        for upstream in self.upstreams:
            yield from upstream.chunk_ids()

    def peers(self) -> Iterator[str]:
        yield self.peer_id
        for upstream in self.upstreams:
            yield from upstream.peers()

    def depth(self) -> int:
        return 1 + max((upstream.depth() for upstream in self.upstreams), default=0)

    def max_fan_in(self) -> int:
        return max([len(self.upstreams), *(u.max_fan_in() for u in self.upstreams)])

    def to_json(self) -> dict[str, Any]:
        return {
            "peer_id": self.peer_id,
            "own": list(self.own),
            "upstreams": [upstream.to_json() for upstream in self.upstreams],
        }

    @classmethod
    def from_json(cls, data: Any, depth: int = 0) -> PlanNode:
        """Parse a plan node from JSON, refusing deep or malformed plans."""
        if depth > PLAN_DEPTH_MAX:
            raise ProtocolError(f"recovery plan deeper than {PLAN_DEPTH_MAX}")
        try:
            upstreams = tuple(cls.from_json(item, depth + 1) for item in data["upstreams"])
            node = cls(str(data["peer_id"]), tuple(str(c) for c in data["own"]), upstreams)
        except (KeyError, TypeError) as exc:
            raise ProtocolError(f"malformed recovery plan: {exc!r}") from exc
        return node


@dataclass(frozen=True, slots=True)
class Plan:
    topology: Topology
    roots: tuple[PlanNode, ...]

    @property
    def max_fan_in(self) -> int:
        """Most streams any receiver (the requester included) takes at once."""
        return max([len(self.roots), *(root.max_fan_in() for root in self.roots)])

    def chunk_ids(self) -> list[str]:
        return [chunk for root in self.roots for chunk in root.chunk_ids()]

    def peers(self) -> list[str]:
        return [peer for root in self.roots for peer in root.peers()]


def assign(chunks: Sequence[ChunkSpec]) -> dict[str, list[str]]:
    """Each chunk to one of its holders, balancing stored bytes; holder -> chunk ids in
    manifest order. Raises ``DataUnavailable`` naming chunks that have no live holder."""
    orphans = [chunk.chunk_id for chunk in chunks if not chunk.holders]
    if orphans:
        raise DataUnavailable(orphans)
    load: dict[str, int] = {}
    choice: dict[str, str] = {}
    for chunk in sorted(chunks, key=lambda c: -c.stored_bytes):
        rank = {holder: index for index, holder in enumerate(chunk.holders)}
        best = min(chunk.holders, key=lambda h: (load.get(h, 0), rank[h]))
        choice[chunk.chunk_id] = best
        load[best] = load.get(best, 0) + chunk.stored_bytes
    assigned: dict[str, list[str]] = {}
    for chunk in chunks:
        assigned.setdefault(choice[chunk.chunk_id], []).append(chunk.chunk_id)
    return assigned


def _ordered(assigned: Mapping[str, list[str]]) -> list[str]:
    """Holders with the most assigned chunks first (stable by id): they start a line or
    sit near a tree's leaves, so that the bulk of the data enters the stream early."""
    return sorted(assigned, key=lambda peer: (-len(assigned[peer]), peer))


def plan_star(chunks: Sequence[ChunkSpec]) -> Plan:
    assigned = assign(chunks)
    roots = tuple(PlanNode(peer, tuple(assigned[peer])) for peer in _ordered(assigned))
    return Plan("star", roots)


def plan_line(chunks: Sequence[ChunkSpec]) -> Plan:
    assigned = assign(chunks)
    node: PlanNode | None = None
    for peer in _ordered(assigned):
        node = PlanNode(peer, tuple(assigned[peer]), (node,) if node is not None else ())
    return Plan("line", (node,) if node is not None else ())


def plan_tree(chunks: Sequence[ChunkSpec], *, fan_in: int = 4) -> Plan:
    """A complete k-ary tree in breadth-first order: the root is the last holder of
    ``_ordered`` (fewest chunks), leaves hold the most."""
    if fan_in < 1:
        raise ValueError("a tree needs a fan-in of at least 1")
    assigned = assign(chunks)
    peers = list(reversed(_ordered(assigned)))
    if not peers:
        return Plan("tree", ())

    def build(index: int) -> PlanNode:
        children = range(index * fan_in + 1, min(index * fan_in + fan_in, len(peers) - 1) + 1)
        peer = peers[index]
        return PlanNode(peer, tuple(assigned[peer]), tuple(build(child) for child in children))

    return Plan("tree", (build(0),))


def parse_topology(name: str) -> Topology:
    """``name`` as a ``Topology``; ``ValueError`` for anything else."""
    for topology in TOPOLOGIES:
        if topology == name:
            return topology
    raise ValueError(f"unknown topology {name!r}")


def build_plan(topology: Topology, chunks: Sequence[ChunkSpec], *, fan_in: int = 4) -> Plan:
    if topology == "star":
        return plan_star(chunks)
    if topology == "line":
        return plan_line(chunks)
    if topology == "tree":
        return plan_tree(chunks, fan_in=fan_in)
    raise ValueError(f"unknown topology {topology!r}")


def tree_depth(holders: int, fan_in: int) -> int:
    """Levels of a complete ``fan_in``-ary tree over ``holders`` nodes (as ``plan_tree``
    builds it). Integer arithmetic: logarithms misjudge exact powers."""
    if fan_in < 1:
        raise ValueError("a tree needs a fan-in of at least 1")
    depth, capacity, level = 0, 0, 1
    while capacity < holders:
        depth += 1
        capacity += level
        level *= fan_in
    return depth
