"""A pure cost model for recovery: estimates star, line and tree times and picks one.

No I/O and no clocks: every function maps values to values. Bandwidth and latency come
from the caller, given or measured (``measured_network`` turns recent transfers into a
``Network``). All rates are bytes per second; ``None`` means unlimited.

The model
---------
Only peers that are assigned a chunk send anything (``recovery.plan.assign`` gives each
chunk to one holder), so ``senders = min(holders, chunks)``. Every estimate is

    seconds = latency_s + transfer_s,   transfer_s = state_bytes / throughput_bytes_s

where ``throughput_bytes_s`` is the steady-state rate of the slowest link, always bounded
by ``node_bytes_s`` (the requester verifies every byte), so seconds are finite even with
unlimited links. The pipeline unit is ``unit_bytes = min(chunk_bytes, state_bytes /
chunks)``: the mean chunk, at most a typical one; a hop forwards a unit once it has
verified it, so a stream through ``levels`` hops reaches the requester after one request
per hop and ``levels - 1`` store-and-forward steps of one unit (the last hop's unit is
part of ``transfer_s``): ``fill_s(levels) = levels * rtt_s + (levels - 1) * unit_bytes /
min(peer_bytes_s, node_bytes_s)``.

* **star**: ``streams = min(senders, connections_max)``;
  ``throughput = min(requester_bytes_s, streams * peer_bytes_s, node_bytes_s)``. Each
  sender streams all of its chunks in answer to one request, ``streams`` senders at a
  time, so ``latency_s = (ceil(senders / streams) + ceil(rerouted / streams)) * rtt_s``
  (a rerouted chunk is fetched on its own). ``max_fan_in = streams``.
* **line**: one chain over the senders; the last hop carries everything, so
  ``throughput = min(requester_bytes_s, peer_bytes_s, node_bytes_s)``. One request per
  hop, then the stream fills hop by hop: ``latency_s = fill_s(senders) + splices * rtt_s``.
  ``max_fan_in = 1``.
* **tree**: ``k = min(tree_fan_in, connections_max)``, ``depth = tree_depth(senders, k)``;
  the root carries everything (same throughput as line);
  ``latency_s = fill_s(depth) + splices * rtt_s``. ``max_fan_in = min(k, senders - 1)``,
  at least 1.

Failed peers: a failed peer was the preferred holder of about its share of the chunks,
``rerouted = ceil(chunks * failed_peers / (holders + failed_peers))``. In a star each of
those chunks costs one extra round trip, ``streams`` in flight. In a line or tree the
failed peer is spliced out (its neighbour reconnects, live replicas append its chunks to
their streams): one round trip per splice, ``splices = min(failed_peers, rerouted)``,
taken one after another (pessimistic for a tree, whose subtrees could splice at once).

``bottleneck`` names the larger of the two terms: the latency kind ("round trips" for a
star, "pipeline fill" for line and tree) or the link that sets the throughput
("requester link", "peer egress", "cpu").

``choose`` takes the cheapest, except that when the cheapest plan is bound by the
requester's link, among the topologies within ``tie_tolerance`` of it it prefers the
smallest ``max_fan_in`` (gentler on the requester, and fan-in buys nothing through a
narrow link), then the cheapest, then the simplest (star, tree, line: fewer peers
relaying; a line relays through every sender but its last, a tree through its inner
nodes only). When CPUs bound it, among those within ``tie_tolerance`` it takes the
simplest: every relay hop costs CPU the model does not count (and on hosts the relays
share with the requester, that CPU is the requester's). When peers' egress bounds it, it
takes the cheapest outright. Its ``reason`` is one sentence naming the
deciding term with numbers.

Known blind spots
-----------------
* No TCP incast, congestion or slow start: ``streams * peer_bytes_s`` is assumed to add up.
* No per-peer ingress limit: a tree node's k children, or a line hop's upstream, are
  bounded only by the sender's egress and the node's CPU.
* Chunks are taken to be of equal size and spread evenly over the senders: a holder with
  more than its share (a skewed assignment) is not modelled, nor are chunks that a single
  holder must serve alone.
* Requests in a star are not pipelined within a stream (one request in flight each),
  and round trips do not overlap with the transfer: an upper bound on both.
* Only the first reroute is counted: a chunk whose second replica is also gone costs one
  more round trip in reality. ``replication`` is checked but does not enter the
  estimate; chunks whose replicas are all gone are the caller's problem (``assign``
  raises ``DataUnavailable`` for them).
* Compression and decompression cost is folded into ``node_bytes_s``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from recovery.plan import TOPOLOGIES, tree_depth

__all__ = [
    "Choice",
    "Estimate",
    "Network",
    "Workload",
    "choose",
    "estimate",
    "measured_network",
]

TRANSFER_BYTES_MIN = 256 * 1024  # smaller transfers are latency-bound: they say little of bandwidth


def _check_count(name: str, value: int, minimum: int = 0) -> None:
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")


def _check_rate(name: str, value: float | None) -> None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite rate or None, got {value}")


@dataclass(frozen=True, slots=True)
class Workload:
    """What a recovery has to move."""

    state_bytes: int  # stored (compressed) bytes of all chunks to move
    chunks: int
    holders: int  # live peers holding at least one needed chunk
    failed_peers: int = 0  # peers lost: their share of chunks costs a reroute
    replication: int = 3

    def __post_init__(self) -> None:
        _check_count("state_bytes", self.state_bytes)
        _check_count("chunks", self.chunks)
        _check_count("holders", self.holders)
        _check_count("failed_peers", self.failed_peers)
        _check_count("replication", self.replication, 1)
        if self.chunks > 0 and self.holders == 0:
            raise ValueError(f"{self.chunks} chunks but no live holder")
        if self.chunks == 0 and self.state_bytes > 0:
            raise ValueError(f"{self.state_bytes} bytes in zero chunks")


@dataclass(frozen=True, slots=True)
class Network:
    """The links and nodes a recovery runs over. Rates in bytes/s; ``None`` = unlimited."""

    peer_bytes_s: float | None = None  # egress per peer
    requester_bytes_s: float | None = None  # requester ingress
    rtt_s: float = 0.0005  # request round trip, plus any added latency
    connections_max: int = 8  # most streams a receiver (requester or peer) takes at once
    node_bytes_s: float = 400e6  # what one process verifies/forwards per second (CPU)
    chunk_bytes: int = 4 * 1024 * 1024  # typical chunk size (pipeline fill)
    tree_fan_in: int = 4

    def __post_init__(self) -> None:
        _check_rate("peer_bytes_s", self.peer_bytes_s)
        _check_rate("requester_bytes_s", self.requester_bytes_s)
        _check_rate("node_bytes_s", self.node_bytes_s)
        if not (math.isfinite(self.rtt_s) and self.rtt_s >= 0):
            raise ValueError(f"rtt_s must be finite and not negative, got {self.rtt_s}")
        _check_count("connections_max", self.connections_max, 1)
        _check_count("chunk_bytes", self.chunk_bytes, 1)
        _check_count("tree_fan_in", self.tree_fan_in, 1)


@dataclass(frozen=True, slots=True)
class Estimate:
    topology: str
    seconds: float
    throughput_bytes_s: float  # steady-state rate of the slowest link (0 when nothing moves)
    max_fan_in: int  # most streams any receiver takes at once
    bottleneck: str  # "requester link", "peer egress", "cpu", "round trips", "pipeline fill"


@dataclass(frozen=True, slots=True)
class Choice:
    topology: str
    estimates: tuple[Estimate, ...]  # one per candidate, in candidate order
    reason: str  # one sentence naming the deciding term, with numbers


@dataclass(frozen=True, slots=True)
class _Terms:
    """An estimate's parts, kept for explaining a choice."""

    topology: str
    latency_s: float
    latency_kind: str  # "round trips" or "pipeline fill"
    latency_label: str  # e.g. "1024 round trips of 20.0 ms"
    throughput_bytes_s: float
    limiter: str  # "requester link", "peer egress" or "cpu"
    rate_label: str  # the limiter, with the streams when they add up: "8 x 50.0 MB/s peer egress"
    transfer_s: float
    max_fan_in: int

    @property
    def seconds(self) -> float:
        return self.latency_s + self.transfer_s

    @property
    def bottleneck(self) -> str:
        return self.latency_kind if self.latency_s > self.transfer_s else self.limiter

    def estimate(self) -> Estimate:
        return Estimate(
            self.topology, self.seconds, self.throughput_bytes_s, self.max_fan_in, self.bottleneck
        )


def _format_s(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} us"


def _format_rate(bytes_s: float) -> str:
    megabytes_s = bytes_s / 1e6
    return f"{megabytes_s:.1f} MB/s" if megabytes_s >= 1 else f"{megabytes_s:.3g} MB/s"


def _slowest(network: Network, streams: int = 1) -> tuple[float, str, str]:
    """The throughput-bounding link: (bytes/s, its name, a label with its numbers)."""
    links: list[tuple[float, str, str]] = []
    if network.requester_bytes_s is not None:
        links.append((network.requester_bytes_s, "requester link", "requester link"))
    if network.peer_bytes_s is not None:
        rate = network.peer_bytes_s
        label = f"{streams} x {_format_rate(rate)} peer egress" if streams > 1 else "peer egress"
        links.append((streams * rate, "peer egress", label))
    links.append((network.node_bytes_s, "cpu", "cpu"))
    return min(links, key=lambda link: link[0])  # first wins a tie: requester, peer, cpu


def _ceil_div(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


def _rerouted_chunks(workload: Workload) -> int:
    lost = workload.failed_peers
    return _ceil_div(workload.chunks * lost, workload.holders + lost)


def _fill_s(levels: int, workload: Workload, network: Network) -> float:
    """Until the first unit reaches the requester through ``levels`` pipelined hops."""
    unit_bytes = min(network.chunk_bytes, workload.state_bytes / workload.chunks)
    hop_bytes_s = min(network.peer_bytes_s or math.inf, network.node_bytes_s)
    return levels * network.rtt_s + (levels - 1) * unit_bytes / hop_bytes_s


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _star(workload: Workload, network: Network) -> _Terms:
    senders = min(workload.holders, workload.chunks)
    streams = min(senders, network.connections_max)
    rate, limiter, rate_label = _slowest(network, streams)
    round_trips = _ceil_div(senders, streams)
    round_trips += _ceil_div(_rerouted_chunks(workload), streams)
    label = f"{_plural(round_trips, 'round trip')} of {_format_s(network.rtt_s)}"
    latency_s = round_trips * network.rtt_s
    transfer_s = workload.state_bytes / rate
    return _Terms(
        "star", latency_s, "round trips", label, rate, limiter, rate_label, transfer_s, streams
    )


def _pipelined(
    topology: str, levels: int, fan_in: int, workload: Workload, network: Network
) -> _Terms:
    """Line and tree: the root's link carries everything; latency is the fill depth."""
    splices = min(workload.failed_peers, _rerouted_chunks(workload))
    latency_s = _fill_s(levels, workload, network) + splices * network.rtt_s
    label = f"pipeline fill over {_plural(levels, 'hop' if topology == 'line' else 'level')}"
    if splices:
        label += f" and {_plural(splices, 'splice')}"
    rate, limiter, rate_label = _slowest(network)
    transfer_s = workload.state_bytes / rate
    return _Terms(
        topology, latency_s, "pipeline fill", label, rate, limiter, rate_label, transfer_s, fan_in
    )


def _line(workload: Workload, network: Network) -> _Terms:
    senders = min(workload.holders, workload.chunks)
    return _pipelined("line", senders, 1, workload, network)


def _tree(workload: Workload, network: Network) -> _Terms:
    senders = min(workload.holders, workload.chunks)
    k = min(network.tree_fan_in, network.connections_max)
    fan_in = max(1, min(k, senders - 1))
    return _pipelined("tree", tree_depth(senders, k), fan_in, workload, network)


def _terms(topology: str, workload: Workload, network: Network) -> _Terms:
    if topology not in TOPOLOGIES:
        raise ValueError(f"unknown topology {topology!r}; expected one of {TOPOLOGIES}")
    if workload.chunks == 0:
        return _Terms(topology, 0.0, "nothing to move", "", 0.0, "nothing to move", "", 0.0, 0)
    if topology == "star":
        return _star(workload, network)
    if topology == "line":
        return _line(workload, network)
    return _tree(workload, network)


def estimate(topology: str, workload: Workload, network: Network) -> Estimate:
    """The estimated recovery of ``workload`` over ``network`` along ``topology``."""
    return _terms(topology, workload, network).estimate()


def _shared_bottleneck(terms: Sequence[_Terms]) -> str:
    """A phrase for one bottleneck that bounds every topology alike, or ``""``."""
    kinds = {term.bottleneck for term in terms}
    rates = {term.throughput_bytes_s for term in terms}
    if len(kinds) > 1:
        return ""
    kind = kinds.pop()
    if kind in {"round trips", "pipeline fill"}:
        return f"{kind} dominates every topology"
    if len(rates) > 1:
        return ""
    return f"{kind} {_format_rate(rates.pop())} is the bottleneck for every topology"


def _tie_reason(
    chosen: _Terms, cheapest: _Terms, terms: Sequence[_Terms], tie_tolerance: float
) -> str:
    context = _shared_bottleneck(terms) or (
        f"{cheapest.topology} is cheapest at {_format_s(cheapest.seconds)} ({cheapest.bottleneck})"
    )
    if cheapest.bottleneck == "cpu":
        gain = "with fewer relays, whose CPU the estimate does not count"
    else:
        gain = f"with fan-in {chosen.max_fan_in} instead of {cheapest.max_fan_in}"
    return (
        f"{context}; {chosen.topology} matches {cheapest.topology} within "
        f"{tie_tolerance * 100:g}% ({_format_s(chosen.seconds)} vs {_format_s(cheapest.seconds)}) "
        f"{gain}"
    )


def _deciding_term(chosen: _Terms, runner_up: _Terms) -> str:
    """The term (throughput or latency) that separates the two estimates most."""
    transfer_gap_s = runner_up.transfer_s - chosen.transfer_s
    latency_gap_s = runner_up.latency_s - chosen.latency_s
    if transfer_gap_s >= latency_gap_s:
        return (
            f"throughput decides: {chosen.topology} moves the bytes at "
            f"{_format_rate(chosen.throughput_bytes_s)} ({chosen.rate_label}), "
            f"{runner_up.topology} at {_format_rate(runner_up.throughput_bytes_s)} "
            f"({runner_up.rate_label})"
        )
    return (
        f"latency decides: {chosen.topology} spends {_format_s(chosen.latency_s)} on "
        f"{chosen.latency_label}, {runner_up.topology} {_format_s(runner_up.latency_s)} on "
        f"{runner_up.latency_label}"
    )


def _win_reason(chosen: _Terms, others: Sequence[_Terms]) -> str:
    seconds = _format_s(chosen.seconds)
    ranked = sorted(others, key=lambda term: (term.seconds, _simplicity(term)))
    if not ranked:
        return f"{chosen.topology} is the only candidate: {seconds} ({chosen.bottleneck})"
    tied = [term.topology for term in ranked if term.seconds == chosen.seconds]
    if tied:
        return (
            f"{chosen.topology} ties with {' and '.join(tied)} at {seconds} ({chosen.bottleneck}) "
            "and is the simplest (ties go to star, then tree, then line: fewer relaying peers)"
        )
    runner_up, *slower = ranked
    rest = [f", {term.topology} {_format_s(term.seconds)} ({term.bottleneck})" for term in slower]
    return (
        f"{chosen.topology} is cheapest at {seconds} against {runner_up.topology} "
        f"{_format_s(runner_up.seconds)}{''.join(rest)}; {_deciding_term(chosen, runner_up)}"
    )


# Fewest relaying peers first: none, a tree's inner nodes, all of a line's senders but one.
_BY_RELAYS = ("star", "tree", "line")


def _simplicity(term: _Terms) -> int:
    """Last tie-break, independent of candidate order: fewer relaying peers first."""
    return _BY_RELAYS.index(term.topology)


def _check_candidates(candidates: Sequence[str]) -> tuple[str, ...]:
    names = tuple(candidates)
    if not names:
        raise ValueError("choose needs at least one candidate topology")
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate candidate topologies: {names}")
    unknown = [name for name in names if name not in TOPOLOGIES]
    if unknown:
        raise ValueError(f"unknown topologies {unknown}; expected some of {TOPOLOGIES}")
    return names


def choose(
    workload: Workload,
    network: Network,
    *,
    candidates: Sequence[str] = TOPOLOGIES,
    tie_tolerance: float = 0.10,
) -> Choice:
    """The cheapest candidate; when the requester's link is the cheapest plan's
    bottleneck, among those within ``tie_tolerance`` of it the one with the smallest
    fan-in. ``reason`` names the deciding term."""
    names = _check_candidates(candidates)
    if not (math.isfinite(tie_tolerance) and tie_tolerance >= 0):
        raise ValueError(f"tie_tolerance must be finite and not negative, got {tie_tolerance}")
    terms = [_terms(name, workload, network) for name in names]
    estimates = tuple(term.estimate() for term in terms)
    if workload.chunks == 0:
        pick = "star" if "star" in names else names[0]
        reason = f"nothing to recover (0 chunks): every topology takes 0 s, {pick} by default"
        return Choice(pick, estimates, reason)
    cheapest = min(terms, key=lambda term: (term.seconds, _simplicity(term)))
    bound_s = cheapest.seconds * (1 + tie_tolerance)
    # Fan-in buys nothing only when the requester's own link is what limits the cheapest
    # plan. When CPUs limit it, every relay hop costs CPU the model does not count (on
    # hosts shared with the relays, it is the requester's): among plans within the
    # tolerance the one with the fewest relays wins. When peers' egress limits it, the
    # cheapest wins outright.
    bottleneck = cheapest.estimate().bottleneck
    if bottleneck not in ("requester link", "cpu"):
        bound_s = cheapest.seconds
    near = [term for term in terms if term.seconds <= bound_s]
    if bottleneck == "cpu":
        chosen = min(near, key=lambda term: (_simplicity(term), term.seconds))
    else:
        chosen = min(near, key=lambda term: (term.max_fan_in, term.seconds, _simplicity(term)))
    if chosen is cheapest:
        reason = _win_reason(chosen, [term for term in terms if term is not chosen])
    else:
        reason = _tie_reason(chosen, cheapest, terms, tie_tolerance)
    return Choice(chosen.topology, estimates, reason)


def measured_network(
    transfers: Sequence[tuple[int, float]],
    rtts_s: Sequence[float],
    *,
    base: Network | None = None,
    transfer_bytes_min: int = TRANSFER_BYTES_MIN,
) -> Network:
    """``base`` (default ``Network()``) with ``rtt_s`` and ``peer_bytes_s`` measured from
    recent round trips and transfers ``(bytes, seconds)``: medians, so that a few outliers
    do not move them.

    Each transfer's seconds include one request round trip, taken off before dividing (at
    most half the duration, so a noisy rtt cannot inflate a rate more than twofold).
    Transfers below ``transfer_bytes_min`` are latency-bound and ignored, as are those
    that took no measurable time (too little to give a finite rate). A transfer is bounded
    by both the sender's egress and the requester's ingress; the rate is attributed to
    peer egress. Transfers are downloads timed as if each had had its peer to itself
    (``ring.transport`` divides a download's seconds by the mean number of requests in
    flight to that peer): timed as they were, eight downloads sharing one peer each look
    eight times slower than the peer is. Downloads from different peers at once share the
    requester's link, which still makes each look slower than its peer when that link is
    the narrower. With no usable sample, the base value stays.
    """
    network = base if base is not None else Network()
    _check_count("transfer_bytes_min", transfer_bytes_min, 1)
    for rtt_s in rtts_s:
        if not (math.isfinite(rtt_s) and rtt_s >= 0):
            raise ValueError(f"a round trip must be finite and not negative, got {rtt_s}")
    for size_bytes, seconds in transfers:
        if size_bytes < 0 or not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(
                f"a transfer needs bytes >= 0 and finite seconds >= 0, got {size_bytes}, {seconds}"
            )
    rtt_s = statistics.median(rtts_s) if rtts_s else network.rtt_s
    rates = [
        size_bytes / max(seconds - rtt_s, seconds / 2)
        for size_bytes, seconds in transfers
        if size_bytes >= transfer_bytes_min and seconds / 2 > 0
    ]
    rates = [rate for rate in rates if math.isfinite(rate)]
    peer_bytes_s = statistics.median(rates) if rates else network.peer_bytes_s
    return replace(network, rtt_s=rtt_s, peer_bytes_s=peer_bytes_s)
