"""Star, line and tree recovery with real peers: byte-identical results, fan-in, failures.

The wire format and plan parsing are checked as pure functions. Everything else runs
against real ``sr3 peer`` processes on 127.0.0.x (``LocalCluster``) holding states of a
few MiB cut into 256 KiB chunks. Fault tests say what they break (peers SIGKILLed
before or during a recovery, the only replica of some chunks gone) and check what must
still hold: byte-identical data, chunks routed around the failed holder without starting
over, or an error naming exactly the chunks that are gone. Mid-recovery kills slow the
peers down with the emulated egress limit (``--egress-rate``) so that the kill lands
while the stream is running.
"""

from __future__ import annotations

import asyncio
import errno
import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from support import SEED, HttpProbe, MakeCluster, chunk_holders, start_cluster

from recovery import frames
from recovery.auto import measured
from recovery.cost import Network
from recovery.executor import locate, recover, recover_blob
from recovery.frames import Frame, FrameParser
from recovery.plan import TOPOLOGIES, Plan, PlanNode, Topology, build_plan
from recovery.relay import PLAN_BYTES_MAX, parse_plan
from ring import codec
from ring.api import RECOVERY_STREAM
from ring.blobs import BlobRef
from ring.client import Client, ClientOptions
from ring.errors import DataUnavailable, ProtocolError
from ring.transport import Timeouts
from sr3.cli import cli
from sr3.local import LocalCluster

STREAM = RECOVERY_STREAM.pattern
KIB = 1024
MIB = 1024 * KIB
CHUNK_BYTES = 256 * KIB
STATE_BYTES = 6 * MIB
PEERS = 6
TREE_FAN_IN = 2
OPTIONS = ClientOptions(chunk_bytes=CHUNK_BYTES, timeouts=Timeouts(connect_s=1.0, read_s=10.0))
# Short failure detection; no re-replication while a test runs (removal grace).
PEER_FLAGS = (
    "--failure-timeout", "1.5", "--gossip-interval", "0.2",
    "--removal-grace", "120", "--repair-interval", "30",
)  # fmt: skip
# Slow enough that a recovery of STATE_BYTES takes seconds, so a kill lands mid-stream
# (with a little added latency, so that this emulation path runs too).
SLOW_EGRESS = "2MB/s"
KILL_AFTER_CHUNKS = 3


def peer_flags(rng: random.Random, *extra: str) -> list[str]:
    return [*PEER_FLAGS, "--seed", str(rng.randrange(2**31)), *extra]


@pytest.fixture(scope="module")
def ring6(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Six peers, R=3, no network emulation; the tests using it kill nothing."""
    flags = peer_flags(random.Random(f"{SEED}/ring6"))
    cluster = start_cluster(tmp_path_factory.mktemp("ring6"), PEERS, peer_flags=flags)
    yield cluster
    cluster.down(purge=True)


async def store_state(client: Client, tmp_path: Path, rng: random.Random) -> tuple[BlobRef, bytes]:
    data = rng.randbytes(STATE_BYTES)  # incompressible: stored bytes = raw bytes
    source = tmp_path / "state.bin"
    source.write_bytes(data)
    return await client.chunks.put_file(source), data


def unique_chunks(ref: BlobRef) -> list[str]:
    return list(dict.fromkeys(extent.chunk_id for extent in ref.extents))


async def plan_of(client: Client, ref: BlobRef, topology: Topology) -> Plan:
    """The plan ``recover`` builds for ``ref`` (the same pure function of the same view)."""
    specs = await locate(client, unique_chunks(ref))
    return build_plan(topology, specs, fan_in=TREE_FAN_IN)


# -- the wire format (pure) -------------------------------------------------------------------


def sample_frames(rng: random.Random) -> list[Frame]:
    chunk_id, stored = codec.encode(rng.randbytes(3000))
    return [
        frames.chunk_frame(chunk_id, stored),
        frames.rerouted_frame(chunk_id, "peer-4"),
        frames.missing_frame("ab" * 16, "no live replica"),
        frames.chunk_frame(*codec.encode(b"")),
        frames.end_frame(),
    ]


def wire(items: list[Frame]) -> bytes:
    return b"".join(b"".join(frames.encode(frame)) for frame in items)


def test_frames_parse_split_at_every_byte_boundary(rng: random.Random) -> None:
    sent = sample_frames(rng)
    data = wire(sent)
    for cut in range(len(data) + 1):
        parser = FrameParser()
        received = parser.feed(data[:cut]) + parser.feed(data[cut:])
        assert received == sent, cut
        assert parser.ended and parser.buffered_bytes == 0


def test_frames_parse_one_byte_at_a_time(rng: random.Random) -> None:
    sent = sample_frames(rng)
    parser = FrameParser()
    received = [frame for byte in wire(sent) for frame in parser.feed(bytes([byte]))]
    assert received == sent


def test_frames_parse_pieces_of_any_buffer_type_and_keep_no_reference_to_a_bytearray(
    rng: random.Random,
) -> None:
    """Payloads are gathered as views of the pieces fed: a bytearray piece the caller
    reuses afterwards must not change (or pin) a frame already returned or still open."""
    sent = [frames.chunk_frame(*codec.encode(rng.randbytes(300_000))), *sample_frames(rng)]
    data = wire(sent)
    parser = FrameParser()
    received: list[Frame] = []
    position = 0
    while position < len(data):
        size = rng.randrange(1, 20_000)
        piece = bytearray(data[position : position + size])
        kind = rng.randrange(3)
        received += parser.feed(
            piece if kind == 0 else memoryview(piece) if kind == 1 else bytes(piece)
        )
        piece[:] = b"\xff" * len(piece)  # the caller reuses its buffer
        piece.extend(b"\x00")  # and resizes it: no view may pin it
        position += size
    assert received == sent
    assert parser.ended and parser.buffered_bytes == 0


@pytest.mark.parametrize(
    ("kind", "length"),
    [
        (frames.KIND_CHUNK, codec.STORED_BYTES_MAX + 1),
        (frames.KIND_CHUNK, 2**32 - 1),
        (frames.KIND_MISSING, frames.NOTE_BYTES_MAX + 1),
        (frames.KIND_END, 1),
        (0, 0),
        (9, 0),
    ],
)
def test_frames_refuse_bad_headers_before_buffering(kind: int, length: int) -> None:
    header = bytes([kind]) + bytes(16) + length.to_bytes(4, "big")
    with pytest.raises(ProtocolError):
        FrameParser().feed(header)


def test_frames_refuse_bytes_after_the_end() -> None:
    end = b"".join(frames.encode(frames.end_frame()))
    with pytest.raises(ProtocolError):
        FrameParser().feed(end + b"\x01")
    parser = FrameParser()
    parser.feed(end)
    with pytest.raises(ProtocolError):
        parser.feed(b"\x01")


# -- plans a relay accepts (pure) -------------------------------------------------------------

ID_A, ID_B = "a" * 32, "b" * 32


def plan_json(node: PlanNode) -> bytes:
    return json.dumps(node.to_json()).encode()


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[" * 100_000 + b"]" * 100_000,
        b'{"peer_id": "me"}',
        b'{"peer_id": "me", "own": "abc", "upstreams": []}',
        plan_json(PlanNode("other", (ID_A,))),
        plan_json(PlanNode("me", (ID_A,), (PlanNode("x", (ID_A,)),))),
        plan_json(PlanNode("me", (ID_A,), (PlanNode("me", (ID_B,)),))),
        plan_json(PlanNode("me", ("A" * 32,))),
        b" " * (PLAN_BYTES_MAX + 1),
    ],
    ids=["not-json", "deep-json", "no-own", "own-string", "other-peer", "dup-chunk",
         "dup-peer", "bad-id", "too-large"],
)  # fmt: skip
def test_parse_plan_refuses(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_plan(body, "me")


def test_parse_plan_accepts_a_tree() -> None:
    plan = PlanNode("me", (ID_A,), (PlanNode("x", (ID_B,)), PlanNode("y", ())))
    assert parse_plan(plan_json(plan), "me") == plan


# -- recovery on a healthy ring ---------------------------------------------------------------


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_each_topology_returns_byte_identical_state(
    ring6: LocalCluster, tmp_path: Path, rng: random.Random, topology: Topology
) -> None:
    async with Client(ring6.ring, ring6.secret, options=OPTIONS) as client:
        ref, data = await store_state(client, tmp_path, rng)
        plan = await plan_of(client, ref, topology)
        out = tmp_path / "out.bin"
        result = await recover_blob(client, ref, out, topology, fan_in=TREE_FAN_IN)
    assert out.read_bytes() == data
    assert result.chunks == len(unique_chunks(ref)) == len(plan.chunk_ids())
    assert result.raw_bytes == STATE_BYTES
    assert (result.rerouted, result.failed_peers, result.duplicate_frames) == ((), (), 0)
    holders = len(set(plan.peers()))
    assert holders == PEERS  # every peer holds replicas of a 24-chunk state
    expected_fan_in = {"star": holders, "line": 1, "tree": TREE_FAN_IN}[topology]
    assert result.max_fan_in == plan.max_fan_in == expected_fan_in
    if topology != "star":
        assert len(plan.roots) == 1 and plan.roots[0].depth() > 1


async def test_locate_reports_holders_and_stored_sizes(
    ring6: LocalCluster, tmp_path: Path, rng: random.Random
) -> None:
    async with Client(ring6.ring, ring6.secret, options=OPTIONS) as client:
        ref, _data = await store_state(client, tmp_path, rng)
        specs = await locate(client, [*unique_chunks(ref), "0" * 32])
    *found, absent = specs
    assert absent.holders == () and absent.stored_bytes == 0
    for spec in found:
        assert sorted(spec.holders) == sorted(chunk_holders(ring6, spec.chunk_id))
        assert len(spec.holders) == 3
        on_disk = Path(ring6.peer(spec.holders[0]).data_dir) / "chunks" / spec.chunk_id[:2]
        assert spec.stored_bytes == (on_disk / spec.chunk_id).stat().st_size


async def test_recover_calls_the_sink_once_per_chunk(
    ring6: LocalCluster, tmp_path: Path, rng: random.Random
) -> None:
    received: dict[str, int] = {}

    async def sink(chunk_id: str, raw: bytes) -> None:
        assert codec.chunk_id(raw) == chunk_id
        received[chunk_id] = received.get(chunk_id, 0) + 1

    async with Client(ring6.ring, ring6.secret, options=OPTIONS) as client:
        ref, _data = await store_state(client, tmp_path, rng)
        chunk_ids = unique_chunks(ref)
        result = await recover(client, chunk_ids * 2, "tree", sink, connections_max=1)
    assert received == dict.fromkeys(chunk_ids, 1)
    assert result.chunks == len(chunk_ids)


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_a_failing_sink_fails_the_recovery_with_its_own_error(
    ring6: LocalCluster, tmp_path: Path, rng: random.Random, topology: Topology
) -> None:
    # A full disk under the sink: the recovery raises that OSError (not a group of it,
    # not a stream failure routed around).
    calls = 0

    async def sink(chunk_id: str, raw: bytes) -> None:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        await asyncio.sleep(0)

    async with Client(ring6.ring, ring6.secret, options=OPTIONS) as client:
        ref, _data = await store_state(client, tmp_path, rng)
        with pytest.raises(OSError) as caught:
            await recover(client, unique_chunks(ref), topology, sink)
    assert caught.type is OSError and caught.value.errno == errno.ENOSPC


# -- the relay endpoint -----------------------------------------------------------------------


async def read_frames(probe: HttpProbe, address: str, plan: PlanNode) -> tuple[int, list[Frame]]:
    answer = await probe.signed(address, "POST", STREAM, body=plan_json(plan))
    if answer.status != 200:
        return answer.status, []
    parser = FrameParser()
    received = parser.feed(answer.body)
    assert parser.ended
    return answer.status, received


async def test_relay_streams_own_chunks_and_routes_around_what_it_lacks(
    ring6: LocalCluster, tmp_path: Path, rng: random.Random
) -> None:
    async with Client(ring6.ring, ring6.secret, options=OPTIONS) as client:
        ref, _data = await store_state(client, tmp_path, rng)
    chunk_ids = unique_chunks(ref)
    me = ring6.cluster.peers[0]
    held = [c for c in chunk_ids if me.peer_id in chunk_holders(ring6, c)][:2]
    lacking = next(c for c in chunk_ids if me.peer_id not in chunk_holders(ring6, c))
    nowhere = "0" * 32
    async with HttpProbe(ring6.secret) as probe:
        status, received = await read_frames(
            probe, me.address, PlanNode(me.peer_id, (*held, lacking, nowhere))
        )
    assert status == 200
    kinds = [(frame.kind, frame.chunk_id) for frame in received]
    assert kinds == [
        *((frames.KIND_CHUNK, c) for c in held),
        (frames.KIND_REROUTED, lacking), (frames.KIND_CHUNK, lacking),
        (frames.KIND_REROUTED, nowhere), (frames.KIND_MISSING, nowhere),
        (frames.KIND_END, "0" * 32),
    ]  # fmt: skip
    for frame in received:
        if frame.kind == frames.KIND_CHUNK:
            codec.decode(frame.payload, frame.chunk_id)
        if frame.kind == frames.KIND_REROUTED:
            assert frame.note == ""  # this peer is alive; it just did not hold them


@pytest.mark.parametrize("case", ["unsigned", "not-json", "malformed", "other-peer"])
async def test_relay_refuses_bad_requests(ring6: LocalCluster, case: str) -> None:
    me, other = ring6.cluster.peers[0], ring6.cluster.peers[1]
    bodies = {
        "unsigned": plan_json(PlanNode(me.peer_id, ())),
        "not-json": b"{not json",
        "malformed": b'{"peer_id": "%s", "own": [1]}' % me.peer_id.encode(),
        "other-peer": plan_json(PlanNode(other.peer_id, ())),
    }
    async with HttpProbe(ring6.secret) as probe:
        if case == "unsigned":
            answer = await probe.send(me.address, "POST", STREAM, body=bodies[case])
        else:
            answer = await probe.signed(me.address, "POST", STREAM, body=bodies[case])
    assert answer.status == (401 if case == "unsigned" else 400), answer.body[:200]
    assert "error" in answer.json()


def test_peer_help_documents_the_network_emulation() -> None:
    output = CliRunner().invoke(cli, ["peer", "--help"], terminal_width=200).output
    assert "--egress-rate" in output and "--added-latency" in output
    assert "emulation" in output.lower()


# -- failures ---------------------------------------------------------------------------------


async def test_each_topology_recovers_with_two_peers_killed_before(
    make_cluster: MakeCluster, tmp_path: Path, rng: random.Random
) -> None:
    """Breaks: 2 of 6 peers SIGKILLed (R=3). Holds: every topology returns the state
    byte-identical, from the 4 survivors only."""
    cluster = make_cluster(PEERS, peer_flags=peer_flags(rng))
    async with Client(cluster.ring, cluster.secret, options=OPTIONS) as client:
        ref, data = await store_state(client, tmp_path, rng)
        killed = rng.sample([peer.peer_id for peer in cluster.cluster.peers], 2)
        for peer_id in killed:
            cluster.kill(peer_id)
        for topology in TOPOLOGIES:
            out = tmp_path / f"{topology}.bin"
            result = await recover_blob(client, ref, out, topology, fan_in=TREE_FAN_IN)
            assert out.read_bytes() == data, topology
            assert result.chunks == len(unique_chunks(ref))
            plan = await plan_of(client, ref, topology)
            assert not set(killed) & set(plan.peers())


def subtree(plan: Plan, peer_id: str) -> PlanNode:
    nodes = list(plan.roots)
    while nodes:
        node = nodes.pop()
        if node.peer_id == peer_id:
            return node
        nodes.extend(node.upstreams)
    raise AssertionError(f"{peer_id} is not in the plan")


def victim_of(plan: Plan) -> PlanNode:
    """Star: the holder sending the most. Line and tree: the root's first upstream, a
    relay with upstreams of its own, so that the peer below it must route around it."""
    if plan.topology == "star":
        return max(plan.roots, key=lambda root: len(root.own))
    victim = plan.roots[0].upstreams[0]
    assert victim.upstreams, "the victim should relay for others"
    return victim


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_holder_killed_mid_recovery_is_routed_around(
    make_cluster: MakeCluster, tmp_path: Path, rng: random.Random, topology: Topology
) -> None:
    """Breaks: one plan peer SIGKILLed after 3 chunks arrived. Holds: the state
    comes back byte-identical; its chunks came around it (rerouted), none of those that
    had arrived before the kill was fetched again, and nothing was delivered twice."""
    slow = ("--egress-rate", SLOW_EGRESS, "--added-latency", "5")
    cluster = make_cluster(PEERS, peer_flags=peer_flags(rng, *slow))
    received: dict[str, bytes] = {}
    before_kill: set[str] = set()
    deliveries: list[str] = []
    async with Client(cluster.ring, cluster.secret, options=OPTIONS) as client:
        ref, data = await store_state(client, tmp_path, rng)
        plan = await plan_of(client, ref, topology)
        victim = victim_of(plan)

        async def sink(chunk_id: str, raw: bytes) -> None:
            deliveries.append(chunk_id)
            if len(deliveries) <= KILL_AFTER_CHUNKS:
                before_kill.add(chunk_id)
            if len(deliveries) == KILL_AFTER_CHUNKS:
                await asyncio.to_thread(cluster.kill, victim.peer_id)
            received[chunk_id] = raw

        result = await recover(client, unique_chunks(ref), topology, sink, fan_in=TREE_FAN_IN)
    assert assemble(ref, received) == data
    assert victim.peer_id in result.failed_peers
    rerouted = set(result.rerouted)
    assert rerouted, "the victim's chunks should have come around it"
    assert rerouted <= set(subtree(plan, victim.peer_id).chunk_ids())
    assert not rerouted & before_kill, "a chunk that had arrived was fetched again"
    assert sorted(deliveries) == sorted(unique_chunks(ref))  # each chunk exactly once
    assert result.duplicate_frames == 0


def assemble(ref: BlobRef, chunks: dict[str, bytes]) -> bytes:
    return b"".join(chunks[e.chunk_id][e.offset : e.offset + e.length] for e in ref.extents)


async def test_a_chunk_being_written_when_its_stream_fails_is_written_whole(
    make_cluster: MakeCluster, tmp_path: Path, rng: random.Random
) -> None:
    """Breaks: the only stream's peer SIGKILLed while the sink is still writing the first
    chunk it got (the stream keeps reading meanwhile). Holds: that write is not cut short
    (a cut-short write would count the chunk delivered and leave it unwritten), and the
    state comes back byte-identical."""
    cluster = make_cluster(PEERS, peer_flags=peer_flags(rng, "--egress-rate", SLOW_EGRESS))
    received: dict[str, bytes] = {}
    async with Client(cluster.ring, cluster.secret, options=OPTIONS) as client:
        ref, data = await store_state(client, tmp_path, rng)
        plan = await plan_of(client, ref, "line")
        streamer = plan.roots[0].peer_id

        async def sink(chunk_id: str, raw: bytes) -> None:
            if not received:
                await asyncio.to_thread(cluster.kill, streamer)
                await asyncio.sleep(0.5)  # the stream fails while this write goes on
            received[chunk_id] = raw

        result = await recover(client, unique_chunks(ref), "line", sink, connections_max=1)
    assert assemble(ref, received) == data
    assert streamer in result.failed_peers


async def test_only_holder_killed_with_r1_names_exactly_the_lost_chunks(
    make_cluster: MakeCluster, tmp_path: Path, rng: random.Random
) -> None:
    """Breaks: R=1 and the only holder of some chunks SIGKILLed. Holds: every topology
    fails with DataUnavailable naming exactly those chunks, and leaves no output file."""
    cluster = make_cluster(4, replication=1, write_quorum=1, peer_flags=peer_flags(rng))
    async with Client(cluster.ring, cluster.secret, options=OPTIONS) as client:
        ref, _data = await store_state(client, tmp_path, rng)
        holder = {c: chunk_holders(cluster, c) for c in unique_chunks(ref)}
        assert all(len(peers) == 1 for peers in holder.values())
        victim = max(
            (peer.peer_id for peer in cluster.cluster.peers),
            key=lambda p: sum(peers == [p] for peers in holder.values()),
        )
        lost = {c for c, peers in holder.items() if peers == [victim]}
        assert 0 < len(lost) < len(holder)
        cluster.kill(victim)
        for topology in TOPOLOGIES:
            out = tmp_path / f"{topology}.bin"
            with pytest.raises(DataUnavailable) as caught:
                await recover_blob(client, ref, out, topology)
            assert set(caught.value.missing) == lost, topology
            assert len(caught.value.missing) == len(lost)
            assert not out.exists()
            assert not (tmp_path / f".{out.name}.sr3-recovering").exists()


async def test_auto_lets_the_cost_model_choose_from_the_given_or_measured_network(
    ring6: LocalCluster, tmp_path: Path, rng: random.Random
) -> None:
    """Holds: "auto" recovers byte-identical state with the topology the cost model
    names, says why, and picks line or tree when told the requester's link is narrow.
    Uploads say nothing of the peers' egress; chunk downloads are what it is measured
    from."""
    async with Client(ring6.ring, ring6.secret, options=OPTIONS) as client:
        ref, data = await store_state(client, tmp_path, rng)
        assert client.transport.transfers() == [], "uploads were taken for peer egress"
        assert measured(client).peer_bytes_s is None
        out = tmp_path / "auto.bin"
        measured_run = await recover_blob(client, ref, out, "auto")
        assert out.read_bytes() == data
        assert measured_run.topology in TOPOLOGIES and measured_run.reason
        await asyncio.gather(*(client.fetch_chunk(c) for c in unique_chunks(ref)[:4]))
        assert client.transport.transfers(), "chunk reads were not sampled"
        assert measured(client).peer_bytes_s is not None
        narrow = Network(requester_bytes_s=5e6, rtt_s=0.0005)
        narrow_run = await recover(
            client, unique_chunks(ref), "auto", _discard, network=narrow, fan_in=TREE_FAN_IN
        )
    assert narrow_run.topology in ("line", "tree"), narrow_run.reason
    assert "requester link" in narrow_run.reason


async def _discard(_chunk_id: str, _raw: bytes) -> None:
    return None
