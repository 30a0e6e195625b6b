"""The package layering and the public names users import.

``make lint`` runs import-linter on the layers contract (``ring`` <- ``recovery`` <-
``spark_connector`` <- ``sr3``); these tests check what it cannot: that the front door
exports exactly the public API, and that a peer process does not load the client or
the local cluster it never uses.
"""

from __future__ import annotations

import subprocess
import sys

import sr3

PUBLIC = {
    "AuthError",
    "BlobRef",
    "ChunkCorrupt",
    "Client",
    "ClientOptions",
    "ConfigError",
    "DataUnavailable",
    "Extent",
    "FileInfo",
    "LocalCluster",
    "NotFound",
    "QuorumError",
    "RecordConflict",
    "RecordContention",
    "RecordUnknown",
    "RecordValue",
    "RingStatus",
    "SR3Error",
    "Source",
    "SyncClient",
}


def test_sr3_exports_exactly_the_public_api_and_each_name_resolves() -> None:
    assert set(sr3.__all__) == PUBLIC
    assert set(dir(sr3)) >= PUBLIC
    for name in PUBLIC:
        assert getattr(sr3, name).__name__ == name


def test_sr3_refuses_an_unknown_name() -> None:
    try:
        sr3.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("sr3.NoSuchThing resolved")


def test_the_peer_program_does_not_load_the_client_or_the_local_cluster() -> None:
    """What ``sr3 peer`` imports (the CLI, its peer command, the peer server and the
    recovery relay it installs) loads neither the client nor the local cluster."""
    probe = (
        "import sys, sr3.cli, sr3.cli.peer, ring.server, ring.peer_config, recovery.relay; "
        "print(sorted(m for m in ('ring.client', 'sr3.local', 'spark_connector', "
        "'recovery.executor') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True
    ).stdout
    assert out.strip() == "[]", out


def test_the_namespace_a_peer_serves_loads_no_spark_connector_code() -> None:
    """A peer serves ``sr3://`` (``filesystem.service``, installed by ``sr3 peer``) without
    the Spark connector: a peer image needs none of it."""
    probe = (
        "import sys, sr3.cli.peer, filesystem.service; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('spark_connector', "
        "'pyspark')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True
    ).stdout
    assert out.strip() == "[]", out


def test_recovery_exports_resolve_lazily() -> None:
    import recovery

    for name in recovery.__all__:
        assert getattr(recovery, name) is not None
    try:
        recovery.nothing_here  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError:
        pass
    else:
        raise AssertionError("recovery.nothing_here resolved")


def test_every_command_in_the_cli_table_resolves_to_that_command() -> None:
    import click

    from sr3.cli import cli

    context = click.Context(cli)
    names = cli.list_commands(context)
    assert {"peer", "cluster", "status", "put", "get", "spark", "drill", "demo"} <= set(names)
    for name in names:
        command = cli.get_command(context, name)
        assert command is not None and command.name == name
