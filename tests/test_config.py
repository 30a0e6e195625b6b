"""Unit tests for ring.config: sizes, and where the ring and secret come from.

What must hold: sizes parse in SI and binary units and anything else is a ConfigError;
ring and secret resolve from flags, then ``SR3_RING``/``SR3_SECRET``, then the cluster
file, each independently; with none of them, a ConfigError says what to do.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from ring.client.view import parse_seeds
from ring.config import ClusterFile, ClusterPeer, cluster_file_path, parse_size, resolve
from ring.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("4096", 4096),
        ("4096b", 4096),
        ("1k", 1000),
        ("1KB", 1000),
        ("1KiB", 1024),
        ("1ki", 1024),
        ("64MiB", 64 * 2**20),
        ("64 mib", 64 * 2**20),
        ("1.5GB", 1_500_000_000),
        ("2GiB", 2 * 2**30),
        ("1TiB", 2**40),
        (" 3 MB ", 3_000_000),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "text",
    # The last two: digits that are not ASCII (an Arabic-Indic 5, a fullwidth 1).
    ["", "MiB", "-1", "1 PB", "1 ib", "ten", "1e6", "0x10", "1,5GB", "\u0665MB", "\uff11.5GB"],
)
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match="not a size"):
        parse_size(text)


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """A clean environment: no SR3_* variables, SR3_HOME in a temporary folder."""
    for name in ("SR3_RING", "SR3_SECRET", "SR3_CLUSTER_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SR3_HOME", str(tmp_path / "home"))
    return monkeypatch


def _write_cluster_file(path: Path) -> ClusterFile:
    cluster = ClusterFile(
        secret="file-secret-0123456789",
        replication=3,
        write_quorum=2,
        vnodes=16,
        peers=(
            ClusterPeer("peer-1", "127.0.0.1:7401", "/d1", pid=123),
            ClusterPeer("peer-2", "127.0.0.2:7401", "/d2"),
        ),
        home="/h",
    )
    cluster.write(path)
    return cluster


def test_cluster_file_round_trip_and_private_mode(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = cluster_file_path()
    assert path == tmp_path / "home" / "cluster.json"
    written = _write_cluster_file(path)
    assert ClusterFile.read(path) == written
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_cluster_file_path_from_env(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env.setenv("SR3_CLUSTER_FILE", str(tmp_path / "elsewhere.json"))
    assert cluster_file_path() == tmp_path / "elsewhere.json"


def test_resolve_from_cluster_file(env: pytest.MonkeyPatch) -> None:
    _write_cluster_file(cluster_file_path())
    settings = resolve(None, None)
    assert settings.ring == "127.0.0.1:7401,127.0.0.2:7401"
    assert settings.secret == "file-secret-0123456789"
    assert settings.cluster is not None


def test_env_beats_cluster_file(env: pytest.MonkeyPatch) -> None:
    _write_cluster_file(cluster_file_path())
    env.setenv("SR3_RING", "10.0.0.1:1")
    env.setenv("SR3_SECRET", "env-secret-0123456789")
    settings = resolve(None, None)
    assert (settings.ring, settings.secret) == ("10.0.0.1:1", "env-secret-0123456789")


def test_flags_beat_env_and_cluster_file(env: pytest.MonkeyPatch) -> None:
    _write_cluster_file(cluster_file_path())
    env.setenv("SR3_RING", "10.0.0.1:1")
    env.setenv("SR3_SECRET", "env-secret-0123456789")
    settings = resolve("10.0.0.2:2", "flag-secret-0123456789")
    assert (settings.ring, settings.secret) == ("10.0.0.2:2", "flag-secret-0123456789")


def test_each_setting_falls_back_independently(env: pytest.MonkeyPatch) -> None:
    _write_cluster_file(cluster_file_path())
    env.setenv("SR3_SECRET", "env-secret-0123456789")
    settings = resolve(None, None)
    assert settings.ring == "127.0.0.1:7401,127.0.0.2:7401"  # file
    assert settings.secret == "env-secret-0123456789"  # env
    settings = resolve("10.0.0.2:2", None)
    assert (settings.ring, settings.secret) == ("10.0.0.2:2", "env-secret-0123456789")
    env.delenv("SR3_SECRET")
    settings = resolve("10.0.0.2:2", None)
    assert (settings.ring, settings.secret) == ("10.0.0.2:2", "file-secret-0123456789")


def test_flags_alone_do_not_read_the_cluster_file(env: pytest.MonkeyPatch) -> None:
    cluster_file_path().parent.mkdir(parents=True)
    cluster_file_path().write_text("{ not json")
    settings = resolve("10.0.0.2:2", "flag-secret-0123456789")
    assert settings.cluster is None


def test_nothing_configured_says_what_to_do(env: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="sr3 cluster up"):
        resolve(None, None)
    with pytest.raises(ConfigError, match="secret"):
        resolve("10.0.0.2:2", None)


@pytest.mark.parametrize(
    "content", ["{ not json", "[]", '{"format": 99}', '{"format": 1}', '{"format": 1, "peers": 5}']
)
def test_broken_cluster_file_is_a_config_error(env: pytest.MonkeyPatch, content: str) -> None:
    cluster_file_path().parent.mkdir(parents=True)
    cluster_file_path().write_text(content)
    with pytest.raises(ConfigError):
        resolve(None, None)


@pytest.mark.parametrize("ring", ["127.0.0.1:\u0665\u0665", "127.0.0.1:\u00b2", "h:"])
def test_a_seed_port_is_ascii_digits(ring: str) -> None:
    """``str.isdigit`` took the first two ports (``int()`` then read or refused them)."""
    with pytest.raises(ConfigError, match="not host:port"):
        parse_seeds(ring)
