"""Cluster metadata: the configuration of a ring, numbered by epoch and decided by a
quorum, and its wire contract. Pure: values in, values out.

A *configuration* is the set of members that place data (``placement``), numbered by an
``epoch`` that grows by one with every change, and the id of the cluster it belongs to
(fixed when the first peer founds the ring). Epoch ``N + 1`` is one single-decree Paxos
instance whose acceptors are the *voters* of epoch ``N``: at most ``VOTERS_MAX`` members
of epoch ``N``, chosen from its member set alone (the lowest xxh3 of their peer ids,
so the choice moves only when a voter leaves). Epoch ``N`` is unique, so every proposer
of ``N + 1`` asks the same voters, and a majority of them must accept before ``N + 1``
exists: a peer cut off from that majority can never change placement, whatever its own
failure detector says. This is Vertical Paxos's shape (each configuration names who
decides the next) with the log kept as a chain of decided configurations, the way
Cassandra's transactional cluster metadata keeps one linear log that every node applies
in order.

Voters are the peers that decide placement; every member still learns each decided
epoch (pushed by the proposer, pulled through gossip when a partner is ahead).

The rules of one instance are ``ring.paxos``'s (``prepare``/``accept`` over a ``Slot``
whose value is the configuration's canonical JSON and whose version is its epoch).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

from ring.errors import ProtocolError
from ring.parse import load_json
from ring.placement import Member

__all__ = [
    "CONFIG_BYTES_MAX",
    "EPOCH_MAX",
    "MEMBERS_MAX",
    "RECENT_MAX",
    "VOTERS_MAX",
    "Configuration",
    "ClusterAnswer",
    "INTERNAL_NETWORK",
    "NETWORKS_MAX",
    "check_address",
    "check_name",
    "check_networks",
    "majority",
    "new_cluster_id",
    "parse_cluster_answer",
]

MEMBERS_MAX = 1024
# Five voters ride through two simultaneous losses, as records do with R = 3 (groups of
# 2R - 1 = 5); more would only slow every change down.
VOTERS_MAX = 5
EPOCH_MAX = 2**53 - 1
# Configurations a peer keeps and serves besides the current one (a peer that missed a
# few changes learns each of them, not only the newest).
RECENT_MAX = 16
_ID_CHARS_MAX = 128
_ADDRESS_CHARS_MAX = 300
_ADDRESS_PATTERN = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):([0-9]{1,5})")
_CLUSTER_PATTERN = re.compile(r"[0-9a-f]{32}")
# A peer's own address is on this network (peer-to-peer traffic); it may also advertise
# an address on each of up to NETWORKS_MAX others (clients outside the peers' network).
INTERNAL_NETWORK = "internal"
NETWORKS_MAX = 8
NETWORK_NAME_PATTERN = re.compile(r"[a-z][a-z0-9-]{0,31}")
# One configuration as JSON: MEMBERS_MAX members of at most ~450 bytes each.
CONFIG_BYTES_MAX = MEMBERS_MAX * 512 + 1024


def check_name(value: Any, name: str, *, empty: bool) -> str:
    """A peer id or zone: printable ASCII without spaces, at most 128 characters. Ids
    are hashed onto the ring (``.encode()``) and named in file names and logs; a lone
    surrogate or a control character learned once would break placement everywhere."""
    if not isinstance(value, str) or not (0 if empty else 1) <= len(value) <= _ID_CHARS_MAX:
        raise ProtocolError(f"a {name} is a string of at most {_ID_CHARS_MAX} characters")
    if not (value.isascii() and value.isprintable()) or " " in value:
        raise ProtocolError(f"a {name} is printable ASCII without spaces")
    return value


def check_address(value: Any) -> str:
    """``host:port`` as peers dial it: an ASCII host name or IP, a port in 1..65535."""
    if not isinstance(value, str) or not 0 < len(value) <= _ADDRESS_CHARS_MAX:
        raise ProtocolError(f"an address is a string of at most {_ADDRESS_CHARS_MAX}")
    match = _ADDRESS_PATTERN.fullmatch(value)
    if match is None or not 0 < int(match.group(1)) < 65536:
        raise ProtocolError(f"address {value[:80]!r} is not host:port")
    return value


def check_networks(value: Any) -> tuple[tuple[str, str], ...]:
    """A peer's addresses on other networks (``{"external": "127.0.0.1:7401"}``): at most
    ``NETWORKS_MAX``, each named by ``NETWORK_NAME_PATTERN``, sorted by name. The
    peer's own ``address`` is on the network named ``INTERNAL_NETWORK``, which is not
    listed here."""
    if not isinstance(value, dict) or len(value) > NETWORKS_MAX:
        raise ProtocolError(f"networks are an object of at most {NETWORKS_MAX} name: address")
    for name in value:
        if not isinstance(name, str) or NETWORK_NAME_PATTERN.fullmatch(name) is None:
            raise ProtocolError(
                f"a network name is {NETWORK_NAME_PATTERN.pattern}, not {str(name)[:40]!r}"
            )
        if name == INTERNAL_NETWORK:
            raise ProtocolError(f"{INTERNAL_NETWORK!r} names the peer's own address")
    return tuple(sorted((name, check_address(address)) for name, address in value.items()))


def majority(count: int) -> int:
    """The smallest part of ``count`` voters or acceptors that any other such part meets
    (configurations and records use it alike; ``ring.paxos`` re-exports it)."""
    return count // 2 + 1


def new_cluster_id(token: bytes) -> str:
    """A cluster id from 16 random bytes (the founder draws them)."""
    if len(token) != 16:
        raise ValueError("a cluster id is made of 16 random bytes")
    return token.hex()


def _voter_rank(member: Member) -> tuple[int, str]:
    return (xxhash.xxh3_64_intdigest(member.peer_id.encode()), member.peer_id)


@dataclass(frozen=True, slots=True)
class Configuration:
    """One decided configuration. ``members`` is kept in peer-id order."""

    cluster: str
    epoch: int
    members: tuple[Member, ...]

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.members, key=lambda member: member.peer_id))
        if len({member.peer_id for member in ordered}) != len(ordered):
            raise ProtocolError("a configuration names each peer once")
        if len(ordered) > MEMBERS_MAX:
            raise ProtocolError(f"a configuration has at most {MEMBERS_MAX} members")
        object.__setattr__(self, "members", ordered)

    @classmethod
    def founding(cls, cluster: str, member: Member) -> Configuration:
        """Epoch 1 of a new ring: its founder alone."""
        return cls(cluster, 1, (member,))

    def ids(self) -> frozenset[str]:
        return frozenset(member.peer_id for member in self.members)

    def member(self, peer_id: str) -> Member | None:
        return next((m for m in self.members if m.peer_id == peer_id), None)

    def voters(self) -> tuple[Member, ...]:
        """Who decides the next epoch: ``VOTERS_MAX`` members at most, a function of the
        member set alone."""
        return tuple(sorted(self.members, key=_voter_rank)[:VOTERS_MAX])

    def next(self, members: Iterable[Member]) -> Configuration:
        """The configuration that follows this one with ``members``."""
        if self.epoch >= EPOCH_MAX:
            raise ProtocolError(f"the configuration epoch reached {EPOCH_MAX}")
        return Configuration(self.cluster, self.epoch + 1, tuple(members))

    def with_member(self, member: Member) -> Configuration:
        """Next epoch with ``member`` added, or its address or zone updated."""
        kept = [m for m in self.members if m.peer_id != member.peer_id]
        return self.next([*kept, member])

    def without(self, peer_ids: Iterable[str]) -> Configuration:
        gone = frozenset(peer_ids)
        return self.next(m for m in self.members if m.peer_id not in gone)

    def to_json(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "epoch": self.epoch,
            "members": [
                {"peer_id": m.peer_id, "address": m.address, "zone": m.zone} for m in self.members
            ],
        }

    def encode(self) -> bytes:
        """Canonical bytes: what a consensus round proposes and a peer saves."""
        return json.dumps(self.to_json(), separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: Any) -> Configuration:
        if not isinstance(data, dict):
            raise ProtocolError("a configuration is a JSON object")
        cluster, epoch, members = data.get("cluster"), data.get("epoch"), data.get("members")
        if not isinstance(cluster, str) or _CLUSTER_PATTERN.fullmatch(cluster) is None:
            raise ProtocolError("a configuration's cluster is 32 hex digits")
        if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 < epoch <= EPOCH_MAX:
            raise ProtocolError(f"a configuration's epoch is an integer in 1..{EPOCH_MAX}")
        if not isinstance(members, list) or not 0 < len(members) <= MEMBERS_MAX:
            raise ProtocolError(f"a configuration has 1..{MEMBERS_MAX} members")
        parsed = []
        for item in members:
            if not isinstance(item, dict):
                raise ProtocolError("a configuration's member is a JSON object")
            parsed.append(
                Member(
                    check_name(item.get("peer_id"), "peer id", empty=False),
                    check_address(item.get("address")),
                    check_name(item.get("zone", ""), "zone", empty=True),
                )
            )
        return cls(cluster, epoch, tuple(parsed))

    @classmethod
    def decode(cls, data: bytes) -> Configuration:
        return cls.from_json(load_json(data, bytes_max=CONFIG_BYTES_MAX))


@dataclass(frozen=True, slots=True)
class ClusterAnswer:
    """``GET /v1/cluster``: the answering peer's current configuration and the ones
    before it that it still keeps (oldest first); ``settled_epoch``: the newest epoch at
    which it knows every member caught up on every record (``ring.settle``)."""

    current: Configuration
    recent: tuple[Configuration, ...] = ()
    settled_epoch: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "current": self.current.to_json(),
            "recent": [config.to_json() for config in self.recent],
            "settled_epoch": self.settled_epoch,
        }

    def chain(self) -> list[Configuration]:
        return [*self.recent, self.current]


def parse_cluster_answer(data: Any) -> ClusterAnswer:
    if not isinstance(data, dict):
        raise ProtocolError("a cluster answer is a JSON object")
    recent = data.get("recent", [])
    if not isinstance(recent, list) or len(recent) > RECENT_MAX:
        raise ProtocolError(f"a cluster answer names at most {RECENT_MAX} recent configurations")
    current = Configuration.from_json(data.get("current"))
    earlier = tuple(Configuration.from_json(item) for item in recent)
    if any(c.cluster != current.cluster or c.epoch >= current.epoch for c in earlier):
        raise ProtocolError("a cluster answer's recent configurations precede its current one")
    settled = data.get("settled_epoch", 0)
    valid = isinstance(settled, int) and not isinstance(settled, bool)
    if not valid or not 0 <= settled <= current.epoch:
        raise ProtocolError("a cluster answer's settled_epoch is an epoch up to its current one")
    return ClusterAnswer(current, earlier, settled)


def chain_after(epoch: int, configs: Sequence[Configuration]) -> list[Configuration]:
    """The configurations of ``configs`` past ``epoch``, in epoch order, each once."""
    by_epoch = {config.epoch: config for config in configs if config.epoch > epoch}
    return [by_epoch[number] for number in sorted(by_epoch)]


# -- wire -------------------------------------------------------------------------------
#
# Routes are in ``ring.api`` (CLUSTER, CLUSTER_LEARN, CLUSTER_PREPARE, CLUSTER_ACCEPT,
# CLUSTER_SUSPECTS); bodies and answers here:
#
#   GET  /v1/cluster                         ClusterAnswer: current and recent configurations
#   POST /v1/cluster/learn                   ClusterAnswer -> {"epoch": n} (the peer's epoch)
#   POST /v1/cluster/prepare?epoch=E&ballot=B
#                                            promise B in the instance deciding epoch E: the
#                                            slot (``ring.paxos`` encoding); 409 "preempted"
#                                            {promised}, "epoch_decided" {cluster: answer},
#                                            "epoch_unready" {epoch}, "not_voter" {epoch}
#   POST /v1/cluster/accept?epoch=E&ballot=B  body: the configuration's canonical bytes;
#                                            {"accepted": B} or a 409 as above
#   GET  /v1/cluster/suspects                {"epoch": n, "down": [peer ids this peer has
#                                            not heard from within the failure timeout]}


def round_path(base: str, epoch: int, ballot: str) -> str:
    return f"{base}?epoch={epoch}&ballot={ballot}"


def suspects_body(epoch: int, down: Iterable[str]) -> dict[str, Any]:
    return {"epoch": epoch, "down": sorted(down)}


def parse_suspects(data: Any) -> frozenset[str]:
    down = data.get("down") if isinstance(data, dict) else None
    if not isinstance(down, list) or len(down) > MEMBERS_MAX:
        raise ProtocolError(f"a suspects answer lists at most {MEMBERS_MAX} peer ids")
    return frozenset(check_name(item, "peer id", empty=False) for item in down)
