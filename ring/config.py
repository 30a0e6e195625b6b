"""Where the ring and the secret come from, and the cluster file that records a cluster.

Resolution order for every command: explicit flags, then the environment (``SR3_RING``,
``SR3_SECRET``), then the cluster file. The cluster file is ``$SR3_CLUSTER_FILE`` if set,
else ``$SR3_HOME/cluster.json`` (``SR3_HOME`` defaults to ``~/.sr3``). ``sr3 cluster up``
writes it (mode 0600: it holds the secret); ``sr3 cluster down`` removes it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ring.errors import ConfigError
from ring.tls import ClientTls

__all__ = [
    "CLUSTER_FILE_FORMAT",
    "ClusterFile",
    "ClusterPeer",
    "Settings",
    "cluster_file_path",
    "parse_size",
    "resolve",
    "sr3_home",
]

CLUSTER_FILE_FORMAT = 1
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?i?b?)\s*$", re.IGNORECASE)
_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "kib": 1024, "ki": 1024,
    "m": 1000**2, "mb": 1000**2, "mib": 1024**2, "mi": 1024**2,
    "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "gi": 1024**3,
    "t": 1000**4, "tb": 1000**4, "tib": 1024**4, "ti": 1024**4,
}  # fmt: skip


def parse_size(text: str) -> int:
    """Bytes in a size such as ``4096``, ``64MiB``, ``1.5GB`` (SI and binary units)."""
    match = _SIZE.match(text)
    if match is None or match.group(2).lower() not in _UNITS:
        raise ConfigError(f"not a size: {text!r} (examples: 4096, 64MiB, 1GB)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def sr3_home() -> Path:
    return Path(os.environ.get("SR3_HOME") or Path.home() / ".sr3")


def cluster_file_path() -> Path:
    explicit = os.environ.get("SR3_CLUSTER_FILE")
    return Path(explicit) if explicit else sr3_home() / "cluster.json"


@dataclass(frozen=True)
class ClusterPeer:
    peer_id: str
    address: str
    data_dir: str
    zone: str = ""
    pid: int | None = None
    log_file: str | None = None


@dataclass(frozen=True)
class ClusterFile:
    secret: str
    replication: int
    write_quorum: int
    vnodes: int
    peers: tuple[ClusterPeer, ...]
    home: str
    # Extra ``sr3 peer`` flags every peer of the cluster runs with (timeouts, rates).
    peer_flags: tuple[str, ...] = ()
    format: int = CLUSTER_FILE_FORMAT
    # The folder of the cluster's TLS files (``sr3 cluster up --tls``): ca.pem, each
    # peer's certificate and key, and client.pem/client.key; "" for plain HTTP.
    tls_dir: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def addresses(self) -> list[str]:
        return [peer.address for peer in self.peers]

    @property
    def client_tls(self) -> ClientTls | None:
        """What a client of this cluster connects with (``tls_dir``'s CA and client
        certificate), or None for plain HTTP."""
        if not self.tls_dir:
            return None
        folder = Path(self.tls_dir)
        return ClientTls(folder / "ca.pem", folder / "client.pem", folder / "client.key")

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(asdict(self), handle, indent=2)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)

    @classmethod
    def read(cls, path: Path) -> ClusterFile:
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict):
                raise ConfigError(f"{path}: not a valid cluster file: not a JSON object")
            if data.get("format") != CLUSTER_FILE_FORMAT:
                raise ConfigError(f"{path}: unsupported cluster file format {data.get('format')}")
            peers = tuple(ClusterPeer(**peer) for peer in data.pop("peers"))
            flags = tuple(str(flag) for flag in data.pop("peer_flags", ()))
            return cls(peers=peers, peer_flags=flags, **data)
        except FileNotFoundError as exc:
            raise ConfigError(f"no cluster file at {path}") from exc
        except (OSError, TypeError, KeyError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{path}: not a valid cluster file: {exc}") from exc


@dataclass(frozen=True)
class Settings:
    ring: str
    secret: str
    cluster: ClusterFile | None


def resolve_tls(cluster: ClusterFile | None) -> ClientTls | None:
    """What a client connects with: ``SR3_TLS_CA`` (with ``SR3_TLS_CERT`` and
    ``SR3_TLS_KEY`` when peers require a client certificate), else the cluster file's
    TLS files when the ring came from it, else None (plain HTTP)."""
    ca = os.environ.get("SR3_TLS_CA", "").strip()
    cert = os.environ.get("SR3_TLS_CERT", "").strip()
    key = os.environ.get("SR3_TLS_KEY", "").strip()
    if ca:
        if bool(cert) != bool(key):
            raise ConfigError("SR3_TLS_CERT and SR3_TLS_KEY go together")
        return ClientTls(Path(ca), Path(cert) if cert else None, Path(key) if key else None)
    if cert or key:
        raise ConfigError("SR3_TLS_CERT and SR3_TLS_KEY need SR3_TLS_CA (the cluster's CA)")
    return cluster.client_tls if cluster is not None else None


def resolve(
    ring: str | None,
    secret: str | None,
    *,
    ring_hint: str = "--ring",
    secret_hint: str = "--secret-file",
) -> Settings:
    """Ring and secret from flags, then ``SR3_RING``/``SR3_SECRET``, then the cluster file.

    ``ring_hint`` and ``secret_hint`` name how the caller passes them (CLI flags by
    default, ``ring=``/``secret=`` for ``Client``) in the error when none is found."""
    ring = ring or os.environ.get("SR3_RING") or None
    secret = secret or os.environ.get("SR3_SECRET") or None
    cluster: ClusterFile | None = None
    path = cluster_file_path()
    if (ring is None or secret is None) and path.exists():
        cluster = ClusterFile.read(path)
        ring = ring or ",".join(cluster.addresses)
        secret = secret or cluster.secret
    if ring is None:
        raise ConfigError(
            f"no ring given: pass {ring_hint}, set SR3_RING, or start one with "
            f"`sr3 cluster up` (no cluster file at {path})"
        )
    if secret is None:
        raise ConfigError(
            f"no secret given: pass {secret_hint}, set SR3_SECRET, or use a cluster file "
            f"(none at {path})"
        )
    return Settings(ring, secret, cluster)
