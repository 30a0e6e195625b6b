"""The settings of one storage peer (``sr3 peer`` flags)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ring.chunkstore import IO_CONCURRENCY_DEFAULT
from ring.gc import GC_GRACE_S_DEFAULT, GC_INTERVAL_S_DEFAULT
from ring.placement import VNODES_DEFAULT
from ring.records import TOMBSTONE_TTL_S_DEFAULT
from ring.scrubber import INTERVAL_S_DEFAULT as SCRUB_INTERVAL_S_DEFAULT
from ring.tls import ServerTls

__all__ = ["RENAME_ABANDONED_S_DEFAULT", "RENAME_SWEEP_INTERVAL_S_DEFAULT", "PeerConfig"]

# A pass every few minutes; a rename copying for half an hour is taken as abandoned (a
# directory rename of the most entries one may move takes minutes on a busy ring).
RENAME_SWEEP_INTERVAL_S_DEFAULT = 300.0
RENAME_ABANDONED_S_DEFAULT = 1800.0


@dataclass(frozen=True)
class PeerConfig:
    peer_id: str
    host: str
    port: int
    data_dir: Path
    secret: str
    # host:port of peers to join through (the overlay bootstraps from them and the first
    # gossip goes to them); empty for the first peer of a new ring.
    seeds: tuple[str, ...] = ()
    zone: str = ""
    replication: int = 3
    write_quorum: int = 2
    vnodes: int = VNODES_DEFAULT
    zone_aware: bool = False
    capacity_bytes: int | None = None
    io_concurrency: int = IO_CONCURRENCY_DEFAULT
    # Chunk files bypass the page cache (O_DIRECT) where the file system takes it.
    direct_io: bool = True
    # The address other peers and clients use, when it differs from host:port (containers).
    advertise: str | None = None
    # (name, host:port): where clients on other networks reach this peer (a port
    # published on a host, a load balancer), sorted by name (``ring.cluster``).
    networks: tuple[tuple[str, str], ...] = ()
    failure_timeout_s: float = 5.0
    removal_grace_s: float = 60.0
    gossip_interval_s: float = 1.0
    repair_interval_s: float = 10.0
    repair_rate_bytes_s: float = 64e6
    # Repair leaves a chunk or record written here this recently to its writer's own
    # requests to the other replicas (``RepairSettings.settle_s``).
    repair_settle_s: float = 2.0
    scrub_rate_bytes_s: float = 8e6
    scrub_interval_s: float = SCRUB_INTERVAL_S_DEFAULT
    # Chunk collection (ring.gc): a round every gc_interval_s (0: off); a chunk no live
    # record references is deleted after gc_grace_s unreferenced and not stored.
    gc_interval_s: float = GC_INTERVAL_S_DEFAULT
    gc_grace_s: float = GC_GRACE_S_DEFAULT
    tombstone_ttl_s: float = TOMBSTONE_TTL_S_DEFAULT
    # The sweep of renames nobody finishes (``filesystem.sweep``): a pass every
    # rename_sweep_interval_s (0: never); a rename copying for rename_abandoned_s is
    # aborted, and one that ended is cleaned up.
    rename_sweep_interval_s: float = RENAME_SWEEP_INTERVAL_S_DEFAULT
    rename_abandoned_s: float = RENAME_ABANDONED_S_DEFAULT
    overlay: bool = True
    # Seeds the generator that picks gossip partners, so a scenario replays.
    rng_seed: int | None = None
    # Network emulation (for drills and benchmarks on one machine, not a production
    # control): a cap on the bytes this peer sends in chunk reads and recovery streams
    # (0: none), and a delay before it answers a chunk read or starts a recovery stream.
    egress_rate_bytes_s: float = 0.0
    added_latency_ms: float = 0.0
    # Serve POST /v1/admin/kill (drills on a running ring); off by default.
    admin_kill: bool = False
    # HTTPS for every HTTP hop to and from this peer (``ring.tls``); None: plain HTTP.
    tls: ServerTls | None = None

    @property
    def address(self) -> str:
        return self.advertise or f"{self.host}:{self.port}"

    @property
    def addresses(self) -> frozenset[str]:
        """Every address a correctly targeted request may name: the advertised one, the
        bound one and those on other networks."""
        return frozenset({self.address, f"{self.host}:{self.port}", *dict(self.networks).values()})
