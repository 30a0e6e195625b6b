"""Tests for recovery.cost: the model's choices in regimes whose answer is known, its
formulas on hand-computed cases, and properties over random workloads and networks.

The regimes come from issue 4: tiny state -> star; a requester link far below the peers'
-> line or tree; many holders behind a connection cap -> tree; a wide requester in front
of slow peers -> star (their egress adds up).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recovery import cost
from recovery.cost import (
    Choice,
    Estimate,
    Network,
    Workload,
    choose,
    estimate,
    measured_network,
)
from recovery.plan import TOPOLOGIES, ChunkSpec, plan_tree

REPLAYABLE = settings(max_examples=200, derandomize=True, database=None, deadline=None)

KiB = 1024
MiB = 1024 * KiB
MB_S = 1e6


def by_topology(choice: Choice) -> dict[str, Estimate]:
    return {entry.topology: entry for entry in choice.estimates}


# --- the regimes ---------------------------------------------------------------------


@pytest.mark.parametrize("rate_bytes_s", [None, 1 * MB_S, 50 * MB_S, 10_000 * MB_S])
@pytest.mark.parametrize("rtt_s", [0.0, 0.0005, 0.05])
def test_tiny_state_goes_star(rate_bytes_s: float | None, rtt_s: float) -> None:
    network = Network(peer_bytes_s=rate_bytes_s, requester_bytes_s=rate_bytes_s, rtt_s=rtt_s)
    choice = choose(Workload(state_bytes=64 * KiB, chunks=1, holders=8), network)
    assert choice.topology == "star", choice.reason
    assert by_topology(choice)["star"].max_fan_in == 1  # one chunk: one stream


def test_a_few_tiny_chunks_go_star_because_a_pipeline_costs_a_round_trip_per_hop() -> None:
    choice = choose(Workload(state_bytes=64 * KiB, chunks=4, holders=8), Network())
    estimates = by_topology(choice)
    assert choice.topology == "star"
    assert estimates["star"].seconds < estimates["tree"].seconds < estimates["line"].seconds
    assert "latency decides" in choice.reason


def test_narrow_requester_link_goes_line_or_tree_and_says_why() -> None:
    workload = Workload(state_bytes=256 * MiB, chunks=64, holders=8)
    network = Network(peer_bytes_s=200 * MB_S, requester_bytes_s=10 * MB_S, rtt_s=0.0005)
    choice = choose(workload, network)
    assert choice.topology in {"line", "tree"}
    assert choice.topology == "line"  # fan-in 1 beats tree's 4 within the tolerance
    assert "requester link 10.0 MB/s is the bottleneck for every topology" in choice.reason
    assert "fan-in 1 instead of 8" in choice.reason
    for entry in choice.estimates:
        assert entry.bottleneck == "requester link"
        assert entry.throughput_bytes_s == 10 * MB_S


def test_without_a_tie_tolerance_the_narrow_link_goes_to_the_strictly_cheapest() -> None:
    workload = Workload(state_bytes=256 * MiB, chunks=64, holders=8)
    network = Network(peer_bytes_s=200 * MB_S, requester_bytes_s=10 * MB_S)
    assert choose(workload, network, tie_tolerance=0.0).topology == "star"


@pytest.mark.parametrize("peer_bytes_s", [None, 500 * MB_S])
def test_many_holders_behind_a_connection_cap_go_tree(peer_bytes_s: float | None) -> None:
    workload = Workload(state_bytes=256 * MiB, chunks=4096, holders=64)
    network = Network(peer_bytes_s=peer_bytes_s, rtt_s=0.02, connections_max=4)
    choice = choose(workload, network)
    estimates = by_topology(choice)
    assert choice.topology == "tree", choice.reason
    # star opens 64 streams, 4 at a time: 16 waves of a 20 ms round trip
    assert estimates["star"].seconds - estimates["tree"].seconds > (16 - 4) * 0.02 - 0.01
    # all three move bytes at the same (cpu) rate: the latency terms decide
    assert estimates["tree"].throughput_bytes_s == estimates["line"].throughput_bytes_s
    assert estimates["star"].throughput_bytes_s == estimates["tree"].throughput_bytes_s
    assert estimates["line"].seconds - estimates["tree"].seconds > 60 * 0.02
    assert "latency decides" in choice.reason
    assert "pipeline fill over 4 levels" in choice.reason
    assert "16 round trips of 20.0 ms" in choice.reason


def test_a_capped_star_in_front_of_slow_peers_beats_a_tree_whose_root_carries_everything() -> None:
    """The cap limits the star to 4 streams, but 4 peers' egress still adds up; the
    tree's root sends everything over one peer's link."""
    workload = Workload(state_bytes=256 * MiB, chunks=4096, holders=64)
    network = Network(peer_bytes_s=50 * MB_S, rtt_s=0.02, connections_max=4)
    choice = choose(workload, network)
    assert choice.topology == "star", choice.reason
    assert by_topology(choice)["star"].throughput_bytes_s == 200 * MB_S


def test_a_restore_on_one_host_goes_star_outright() -> None:
    """Fast links everywhere (a checkpoint's restore with the ring on the same host):
    every plan is CPU-bound and the star, one stream per holder, has the shortest
    latency term too."""
    workload = Workload(state_bytes=295 * MiB, chunks=70, holders=5, failed_peers=0)
    choice = choose(workload, Network(rtt_s=0.0016))
    assert choice.topology == "star", choice.reason
    assert "star is cheapest" in choice.reason


def test_cpu_bound_recovery_goes_to_the_plan_with_fewest_relays_within_the_tolerance() -> None:
    """Every plan CPU-bound, and a connection cap makes the star open its streams in
    waves: the tree's latency term wins on paper by about 1 %, but its relays cost CPU
    the estimate does not count. Star, and the reason says why."""
    workload = Workload(state_bytes=295 * MiB, chunks=4096, holders=12, failed_peers=0)
    network = Network(rtt_s=0.005, connections_max=2)
    estimates = {e.topology: e for e in choose(workload, network).estimates}
    assert estimates["tree"].seconds < estimates["star"].seconds  # the model's own view
    assert estimates["tree"].bottleneck == estimates["star"].bottleneck == "cpu"
    choice = choose(workload, network)
    assert choice.topology == "star", choice.reason
    assert "fewer relays" in choice.reason
    strict = choose(workload, network, tie_tolerance=0.0)
    assert strict.topology == "tree"


def test_wide_requester_in_front_of_slow_peers_goes_star() -> None:
    workload = Workload(state_bytes=256 * MiB, chunks=64, holders=8)
    choice = choose(workload, Network(peer_bytes_s=50 * MB_S))
    estimates = by_topology(choice)
    assert choice.topology == "star", choice.reason
    assert estimates["star"].max_fan_in == 8
    assert estimates["star"].throughput_bytes_s == 400 * MB_S  # 8 x 50 MB/s, at the cpu bound
    assert estimates["line"].throughput_bytes_s == 50 * MB_S
    assert "throughput decides" in choice.reason
    assert "8 x 50.0 MB/s peer egress" in choice.reason


# --- the formulas on hand-computed cases ---------------------------------------------


def test_formulas_by_hand() -> None:
    workload = Workload(state_bytes=256 * MiB, chunks=64, holders=8)
    network = Network(peer_bytes_s=50 * MB_S, rtt_s=0.001)
    transfer_slow_s = 256 * MiB / (50 * MB_S)
    hop_s = 4 * MiB / (50 * MB_S)
    star = estimate("star", workload, network)
    # 8 senders, 8 streams: one wave of one round trip
    assert star.seconds == pytest.approx(1 * 0.001 + 256 * MiB / (400 * MB_S))
    line = estimate("line", workload, network)
    assert line.seconds == pytest.approx(8 * 0.001 + 7 * hop_s + transfer_slow_s)
    assert (line.max_fan_in, line.bottleneck) == (1, "peer egress")
    tree = estimate("tree", workload, network)  # 8 holders, k = 4: two levels below the root
    assert tree.seconds == pytest.approx(3 * 0.001 + 2 * hop_s + transfer_slow_s)
    assert tree.max_fan_in == 4


def test_failed_peers_cost_reroutes() -> None:
    network = Network(rtt_s=0.01)
    healthy = Workload(state_bytes=64 * MiB, chunks=64, holders=6)
    degraded = dataclasses.replace(healthy, failed_peers=2)  # a quarter of the chunks: 16
    star_extra_s = estimate("star", degraded, network).seconds
    star_extra_s -= estimate("star", healthy, network).seconds
    assert star_extra_s == pytest.approx(math.ceil(16 / 6) * 0.01)
    for topology in ("line", "tree"):  # one splice per failed peer
        extra_s = estimate(topology, degraded, network).seconds
        extra_s -= estimate(topology, healthy, network).seconds
        assert extra_s == pytest.approx(2 * 0.01)


def test_connection_cap_bounds_star_streams() -> None:
    workload = Workload(state_bytes=64 * MiB, chunks=64, holders=32)
    star = estimate("star", workload, Network(peer_bytes_s=10 * MB_S, connections_max=4))
    assert star.max_fan_in == 4
    assert star.throughput_bytes_s == 40 * MB_S


def test_requester_cpu_bounds_unlimited_links() -> None:
    workload = Workload(state_bytes=4 * 1024 * MiB, chunks=1024, holders=8)
    for topology in TOPOLOGIES:
        entry = estimate(topology, workload, Network(rtt_s=0.0, node_bytes_s=100 * MB_S))
        assert entry.throughput_bytes_s == 100 * MB_S
        assert entry.bottleneck == "cpu"
        assert math.isfinite(entry.seconds)


@pytest.mark.parametrize("fan_in", [2, 3, 4])
@pytest.mark.parametrize("holders", range(1, 41))
def test_tree_levels_match_the_plans(fan_in: int, holders: int) -> None:
    """With rtt 1 s and negligible bytes, a tree's seconds count its levels."""
    workload = Workload(state_bytes=holders, chunks=holders, holders=holders)
    network = Network(rtt_s=1.0, node_bytes_s=1e15, tree_fan_in=fan_in)
    specs = [ChunkSpec(f"chunk-{i}", 1, (f"peer-{i:02d}",)) for i in range(holders)]
    plan = plan_tree(specs, fan_in=fan_in)
    entry = estimate("tree", workload, network)
    assert round(entry.seconds) == plan.roots[0].depth()
    assert entry.max_fan_in == max(1, plan.max_fan_in)


def test_zero_chunks_take_no_time_and_go_star() -> None:
    choice = choose(Workload(state_bytes=0, chunks=0, holders=0), Network())
    assert choice.topology == "star"
    assert "0 chunks" in choice.reason
    assert [entry.seconds for entry in choice.estimates] == [0.0, 0.0, 0.0]
    only_tree = choose(Workload(0, 0, 3), Network(), candidates=("tree",))
    assert only_tree.topology == "tree"


def test_single_candidate_reason() -> None:
    choice = choose(Workload(MiB, 1, 1), Network(), candidates=("line",))
    assert choice.topology == "line"
    assert "only candidate" in choice.reason


# --- validation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"state_bytes": -1, "chunks": 1, "holders": 1},
        {"state_bytes": 1, "chunks": -1, "holders": 1},
        {"state_bytes": 1, "chunks": 1, "holders": -1},
        {"state_bytes": 1, "chunks": 1, "holders": 0},
        {"state_bytes": 1, "chunks": 0, "holders": 1},
        {"state_bytes": 1, "chunks": 1, "holders": 1, "failed_peers": -1},
        {"state_bytes": 1, "chunks": 1, "holders": 1, "replication": 0},
    ],
)
def test_invalid_workloads_are_refused(fields: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        Workload(**fields)


@pytest.mark.parametrize(
    "fields",
    [
        {"peer_bytes_s": 0.0},
        {"peer_bytes_s": -1.0},
        {"peer_bytes_s": math.inf},
        {"requester_bytes_s": 0.0},
        {"requester_bytes_s": math.nan},
        {"node_bytes_s": 0.0},
        {"rtt_s": -0.001},
        {"rtt_s": math.inf},
        {"connections_max": 0},
        {"chunk_bytes": 0},
        {"tree_fan_in": 0},
    ],
)
def test_invalid_networks_are_refused(fields: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Network(**fields)  # type: ignore[arg-type]


def test_invalid_choices_are_refused() -> None:
    workload, network = Workload(MiB, 1, 1), Network()
    with pytest.raises(ValueError):
        estimate("ring", workload, network)
    for candidates in [(), ("star", "star"), ("star", "mesh")]:
        with pytest.raises(ValueError):
            choose(workload, network, candidates=candidates)
    for tolerance in [-0.1, math.inf, math.nan]:
        with pytest.raises(ValueError):
            choose(workload, network, tie_tolerance=tolerance)


# --- measured networks ---------------------------------------------------------------


def test_measured_network_takes_medians_and_ignores_small_transfers() -> None:
    transfers = [
        (4 * MiB, 4 * MiB / (40 * MB_S) + 0.002),
        (4 * MiB, 4 * MiB / (50 * MB_S) + 0.002),
        (4 * MiB, 4 * MiB / (60 * MB_S) + 0.002),
        (4 * MiB, 30.0),  # a stalled transfer and a burst do not move the median
        (4 * MiB, 0.003),
        (4 * MiB, 0.0),  # no measurable time: ignored
        (1 * KiB, 0.002),  # latency-bound: ignored
    ]
    rtts_s = [0.001, 0.002, 0.002, 0.003, 0.5]
    base = Network(requester_bytes_s=100 * MB_S, connections_max=6)
    network = measured_network(transfers, rtts_s, base=base)
    assert network.rtt_s == 0.002
    assert network.peer_bytes_s == pytest.approx(50 * MB_S)
    assert (network.requester_bytes_s, network.connections_max) == (100 * MB_S, 6)


def test_measured_network_without_samples_keeps_the_base() -> None:
    base = Network(peer_bytes_s=7 * MB_S, rtt_s=0.03)
    assert measured_network([], [], base=base) == base
    assert measured_network([(10, 1.0)], [], base=base) == base
    assert measured_network([], []) == Network()


@pytest.mark.parametrize("transfers, rtts_s", [([(-1, 1.0)], []), ([(1, -1.0)], []), ([], [-1.0])])
def test_measured_network_refuses_negative_samples(
    transfers: list[tuple[int, float]], rtts_s: list[float]
) -> None:
    with pytest.raises(ValueError):
        measured_network(transfers, rtts_s)


def test_public_names() -> None:
    assert set(cost.__all__) == {
        "Choice",
        "Estimate",
        "Network",
        "Workload",
        "choose",
        "estimate",
        "measured_network",
    }


# --- properties ----------------------------------------------------------------------

rates = st.floats(min_value=1e3, max_value=1e11)


@st.composite
def workloads(draw: st.DrawFn, *, nonzero: bool = False) -> Workload:
    chunks = draw(st.integers(min_value=1 if nonzero else 0, max_value=10_000))
    holders = draw(st.integers(min_value=1 if chunks else 0, max_value=256))
    state_bytes = draw(st.integers(min_value=1 if chunks else 0, max_value=chunks * 64 * MiB))
    failed_peers = draw(st.integers(min_value=0, max_value=10))
    replication = draw(st.integers(min_value=1, max_value=5))
    return Workload(state_bytes, chunks, holders, failed_peers, replication)


networks = st.builds(
    Network,
    peer_bytes_s=st.none() | rates,
    requester_bytes_s=st.none() | rates,
    rtt_s=st.floats(min_value=0.0, max_value=1.0),
    connections_max=st.integers(min_value=1, max_value=64),
    node_bytes_s=rates,
    chunk_bytes=st.integers(min_value=1, max_value=64 * MiB),
    tree_fan_in=st.integers(min_value=1, max_value=16),
)
growth = st.floats(min_value=1.0, max_value=1e3)


def seconds(workload: Workload, network: Network) -> list[float]:
    return [estimate(topology, workload, network).seconds for topology in TOPOLOGIES]


def no_slower(after: list[float], before: list[float]) -> bool:
    return all(a <= b for a, b in zip(after, before, strict=True))


@REPLAYABLE
@given(workload=workloads(nonzero=True), network=networks)
def test_estimates_are_finite_and_positive(workload: Workload, network: Network) -> None:
    for topology in TOPOLOGIES:
        entry = estimate(topology, workload, network)
        assert math.isfinite(entry.seconds)
        assert entry.seconds > 0
        assert 0 < entry.throughput_bytes_s <= network.node_bytes_s
        assert 1 <= entry.max_fan_in <= network.connections_max
    star = estimate("star", workload, network)
    assert star.max_fan_in <= min(network.connections_max, workload.holders, workload.chunks)


@REPLAYABLE
@given(
    workload=workloads(),
    network=networks,
    factor=growth,
    field=st.sampled_from(["peer_bytes_s", "requester_bytes_s", "node_bytes_s"]),
)
def test_more_bandwidth_is_never_slower(
    workload: Workload, network: Network, factor: float, field: str
) -> None:
    rate = getattr(network, field)
    changes: list[dict[str, Any]] = [{field: rate * factor}] if rate is not None else []
    if field != "node_bytes_s":
        changes.append({field: None})
    wider = [dataclasses.replace(network, **change) for change in changes]
    for network_wider in wider:
        assert no_slower(seconds(workload, network_wider), seconds(workload, network))


@REPLAYABLE
@given(workload=workloads(nonzero=True), network=networks, extra=st.integers(0, 10 * 1024 * MiB))
def test_more_state_is_never_faster(workload: Workload, network: Network, extra: int) -> None:
    bigger = dataclasses.replace(workload, state_bytes=workload.state_bytes + extra)
    assert no_slower(seconds(workload, network), seconds(bigger, network))


@REPLAYABLE
@given(workload=workloads(), network=networks, extra_s=st.floats(min_value=0.0, max_value=1.0))
def test_longer_round_trips_are_never_faster(
    workload: Workload, network: Network, extra_s: float
) -> None:
    slower = dataclasses.replace(network, rtt_s=network.rtt_s + extra_s)
    assert no_slower(seconds(workload, network), seconds(workload, slower))


@REPLAYABLE
@given(workload=workloads(), network=networks, more=st.integers(min_value=0, max_value=10))
def test_more_failed_peers_are_never_faster(
    workload: Workload, network: Network, more: int
) -> None:
    degraded = dataclasses.replace(workload, failed_peers=workload.failed_peers + more)
    assert no_slower(seconds(workload, network), seconds(degraded, network))


@REPLAYABLE
@given(workload=workloads(), network=networks, more=st.integers(min_value=0, max_value=64))
def test_more_connections_are_never_slower(workload: Workload, network: Network, more: int) -> None:
    wider = dataclasses.replace(network, connections_max=network.connections_max + more)
    assert no_slower(seconds(workload, wider), seconds(workload, network))


@REPLAYABLE
@given(
    workload=workloads(),
    network=networks,
    order=st.permutations(TOPOLOGIES),
    count=st.integers(min_value=1, max_value=3),
    tolerance=st.floats(min_value=0.0, max_value=1.0),
)
def test_choose_picks_a_candidate_within_tolerance_of_the_cheapest(
    workload: Workload, network: Network, order: list[str], count: int, tolerance: float
) -> None:
    candidates = tuple(order[:count])
    choice = choose(workload, network, candidates=candidates, tie_tolerance=tolerance)
    assert choice.topology in candidates
    assert tuple(entry.topology for entry in choice.estimates) == candidates
    assert all(entry == estimate(entry.topology, workload, network) for entry in choice.estimates)
    cheapest_s = min(entry.seconds for entry in choice.estimates)
    assert by_topology(choice)[choice.topology].seconds <= cheapest_s * (1 + tolerance)
    assert choice.reason
    assert ". " not in choice.reason  # one sentence
    # deterministic, and independent of the order the candidates come in
    again = choose(workload, network, candidates=candidates[::-1], tie_tolerance=tolerance)
    assert (again.topology, again.reason) == (choice.topology, choice.reason)
    assert choose(workload, network, candidates=candidates, tie_tolerance=tolerance) == choice


@REPLAYABLE
@given(workload=workloads(nonzero=True), network=networks)
def test_choose_without_tolerance_is_the_cheapest(workload: Workload, network: Network) -> None:
    choice = choose(workload, network, tie_tolerance=0.0)
    assert by_topology(choice)[choice.topology].seconds == min(seconds(workload, network))
