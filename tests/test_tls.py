"""TLS on every HTTP hop, with real peers and real certificates.

A three-peer ring made by ``LocalCluster.create(tls=True)`` (what ``sr3 cluster up --tls``
runs): the cluster's own CA, one certificate per peer naming its address, peers that
serve HTTPS only, call each other over HTTPS and require a client certificate from the
CA. What breaks and what must hold:

- Clients with the CA and a client certificate store and read files and records, and
  the ring formed and settled (its peers' gossip, votes and catch-ups went over TLS).
- A plain-HTTP client, a client trusting another CA, a client whose certificate
  another CA issued, and a peer certificate that expired: each refused with one line
  saying what was wrong; nothing is served to them, and nothing stored is lost.
- A renewed certificate written over the peer's files is served without a restart.
"""

from __future__ import annotations

import asyncio
import datetime
import shutil
import socket
import ssl
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from support import require_spark, start_cluster

from ring.client import Client, ClientOptions
from ring.errors import ConfigError, PeerUnavailable, SR3Error
from ring.tls import ClientTls, ServerTls, client_context, server_context
from spark_connector.jar import fs_jar, spark_jars_dir
from sr3.certs import init_ca, issue
from sr3.cli import cli
from sr3.local import LocalCluster

CHECK_INTERVAL_S = 0.5
WAIT_S = 20.0


def _san(cert_file: Path) -> tuple[list[str], list[str]]:
    cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    dns = names.get_values_for_type(x509.DNSName)
    ips = [str(ip) for ip in names.get_values_for_type(x509.IPAddress)]
    return dns, ips


def test_the_ca_and_certificates_name_their_hosts_and_load(tmp_path: Path) -> None:
    """``sr3 tls init`` and ``issue``: the CA key is private, a certificate names every
    host it was issued for and serves and connects, and the CA is not replaced."""
    runner = CliRunner()
    ca = tmp_path / "ca"
    result = runner.invoke(cli, ["tls", "init", "--dir", str(ca)])
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE((ca / "ca.key").stat().st_mode) == 0o600
    result = runner.invoke(
        cli,
        ["tls", "issue", "--ca", str(ca), "--name", "peer-1", "--san", "peer1",
         "--san", "10.0.0.1", "--out", str(tmp_path / "certs")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    cert, key = tmp_path / "certs" / "peer-1.pem", tmp_path / "certs" / "peer-1.key"
    assert _san(cert) == (["peer1"], ["10.0.0.1"])
    usage = x509.load_pem_x509_certificate(cert.read_bytes()).extensions
    eku = usage.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH} <= set(eku)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    server_context(ServerTls(cert, key, ca / "ca.pem", require_client_cert=True))
    client_context(ClientTls(ca / "ca.pem", cert, key))
    again = runner.invoke(cli, ["tls", "init", "--dir", str(ca)])
    assert again.exit_code != 0 and "already holds a CA" in again.output
    with pytest.raises(ConfigError, match="neither an IP address nor a host name"):
        issue(ca, tmp_path, "bad", ["no spaces allowed"])


@pytest.fixture(scope="module")
def tls_ring(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    home = tmp_path_factory.mktemp("tls-ring")
    flags = ["--tls-check-interval", str(CHECK_INTERVAL_S), "--scrub-rate", "0"]
    cluster = start_cluster(home, 3, tls=True, peer_flags=flags)
    try:
        yield cluster
    finally:
        cluster.down(purge=True)


def _options(tls: ClientTls | None) -> ClientOptions:
    return ClientOptions(tls=tls, write_attempt_s=2.0, read_attempt_s=2.0, ring_refresh_s=0.5)


async def test_a_tls_ring_serves_files_and_records_to_a_client_with_a_certificate(
    tls_ring: LocalCluster,
) -> None:
    data = b"over tls " * 100_000
    async with Client(tls_ring.ring, tls_ring.secret, options=_options(tls_ring.client_tls)) as c:
        ref = await c.chunks.put_blob(data)
        assert await c.chunks.get_blob(ref) == data
        assert await c.put_record("tls/kept", b"v", expected_version=0) == 1
        status = await c.admin.status()
        assert all(peer.state == "up" for peer in status.peers)


async def _refused(tls_ring: LocalCluster, tls: ClientTls | None) -> str:
    async with Client(tls_ring.ring, tls_ring.secret, options=_options(tls)) as client:
        with pytest.raises(SR3Error) as caught:
            await client.get_record("tls/kept")
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message
    return message


async def test_a_plain_http_client_is_refused_with_one_line(tls_ring: LocalCluster) -> None:
    message = await _refused(tls_ring, None)
    assert "TLS" in message or "HTTPS" in message, message


async def test_a_client_trusting_another_ca_is_refused(
    tls_ring: LocalCluster, tmp_path: Path
) -> None:
    other = tmp_path / "other-ca"
    init_ca(other)
    assert tls_ring.client_tls is not None
    wrong = ClientTls(other / "ca.pem", tls_ring.client_tls.cert_file, tls_ring.client_tls.key_file)
    message = await _refused(tls_ring, wrong)
    assert "certificate was refused" in message and "not from the CA" in message, message


async def test_a_client_certificate_from_another_ca_is_refused(
    tls_ring: LocalCluster, tmp_path: Path
) -> None:
    other = tmp_path / "other-ca"
    init_ca(other)
    stranger = issue(other, tmp_path, "stranger", ["localhost"])
    assert tls_ring.client_tls is not None
    tls = ClientTls(tls_ring.client_tls.ca_file, stranger.cert, stranger.key)
    message = await _refused(tls_ring, tls)
    assert "TLS" in message, message


async def _served_serial(address: str, ca_file: Path) -> int:
    """The serial number of the certificate the peer at ``address`` presents now."""
    host, _, port = address.rpartition(":")

    def fetch() -> int:
        context = ssl.create_default_context(cafile=str(ca_file))
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # reading the certificate, even an expired one
        with (
            socket.create_connection((host, int(port)), timeout=5) as sock,
            context.wrap_socket(sock) as tls,
        ):
            der = tls.getpeercert(binary_form=True)
        assert der is not None
        return int(x509.load_der_x509_certificate(der).serial_number)

    return await asyncio.to_thread(fetch)


async def test_an_expired_certificate_is_refused_and_a_renewal_is_served_without_restart(
    tls_ring: LocalCluster,
) -> None:
    """Breaks: peer-1's certificate is renewed over its files with one that expired
    yesterday, then renewed again with a good one. Must hold: a client that reaches
    only peer-1 is refused ("certificate has expired") once peer-1 serves the expired
    one; then the good one is served by the same process, and the record reads back."""
    folder = Path(tls_ring.cluster.tls_dir)
    peer = tls_ring.peer("peer-1")
    pid = peer.pid
    host = peer.address.rpartition(":")[0]
    ca_file = folder / "ca.pem"
    before = await _served_serial(peer.address, ca_file)
    yesterday = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=2)
    expired = issue(folder, folder, "peer-1", [host, "localhost"], days=1, valid_from=yesterday)
    expired_serial = x509.load_pem_x509_certificate(expired.cert.read_bytes()).serial_number

    async def serving(serial: int) -> None:
        deadline = time.monotonic() + WAIT_S
        while await _served_serial(peer.address, ca_file) != serial:
            assert time.monotonic() < deadline, "the peer did not load the renewed files"
            await asyncio.sleep(0.2)

    await serving(expired_serial)
    assert expired_serial != before
    async with Client(peer.address, tls_ring.secret, options=_options(tls_ring.client_tls)) as c:
        with pytest.raises(PeerUnavailable) as caught:
            await c.view.ring()
    assert "certificate has expired" in str(caught.value), caught.value

    renewed = issue(folder, folder, "peer-1", [host, "localhost"])
    await serving(x509.load_pem_x509_certificate(renewed.cert.read_bytes()).serial_number)
    assert tls_ring.peer("peer-1").pid == pid, "renewed without a restart"
    async with Client(peer.address, tls_ring.secret, options=_options(tls_ring.client_tls)) as c:
        record = await c.get_record("tls/kept")
        assert record is not None and record.value == b"v"


def test_refused_handshakes_left_no_traceback_in_a_peer_log(tls_ring: LocalCluster) -> None:
    """After the refusals above (plain HTTP, other CAs, an expired certificate), every
    peer is up under the same process and its log holds no traceback."""
    for peer in tls_ring.cluster.peers:
        assert tls_ring.running(peer.peer_id), peer.peer_id
        log = Path(peer.log_file or "").read_text(errors="replace")
        assert "Traceback" not in log, (peer.peer_id, log[-3000:])


def _contract(
    jar: Path, tls_ring: LocalCluster, root: str, *flags: str
) -> subprocess.CompletedProcess[str]:
    jars, _version = spark_jars_dir()
    command = [
        "java", f"-Dfs.sr3.ring={tls_ring.ring}", f"-Dfs.sr3.secret={tls_ring.secret}",
        "-Dfs.sr3.retries=1", *flags, "-cp", f"{jar}:{jars}/*",
        "sr3.hadoop.ContractCheck", "contract", root,
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)


def test_the_java_filesystem_speaks_tls_with_the_cluster_ca_and_says_why_not_without(
    tls_ring: LocalCluster, tmp_path: Path
) -> None:
    """The Java ``sr3://`` FileSystem with the CA and a client certificate (files, as
    a Kubernetes secret mounts them; ``spark_conf`` ships the PEM text itself): the
    contract checks pass. Without TLS settings, and trusting another CA: it fails with
    one line naming TLS."""
    require_spark()
    if shutil.which("javac") is None:
        pytest.skip("no javac")
    jar = fs_jar()
    tls = tls_ring.client_tls
    assert tls is not None and tls.cert_file is not None and tls.key_file is not None
    good = _contract(
        jar, tls_ring, "/java/tls",
        f"-Dfs.sr3.tls.ca={tls.ca_file}", f"-Dfs.sr3.tls.cert={tls.cert_file}",
        f"-Dfs.sr3.tls.secret.key={tls.key_file}",
    )  # fmt: skip
    assert good.returncode == 0, good.stdout + good.stderr[-3000:]
    assert not [line for line in good.stdout.splitlines() if line.startswith("FAIL ")]
    plain = _contract(jar, tls_ring, "/java/plain")
    assert plain.returncode != 0
    assert "TLS" in plain.stdout + plain.stderr, plain.stdout[-2000:]
    other = tmp_path / "java-other-ca"
    init_ca(other)
    wrong = _contract(
        jar, tls_ring, "/java/wrong", f"-Dfs.sr3.tls.ca={other / 'ca.pem'}",
        f"-Dfs.sr3.tls.cert={tls.cert_file}", f"-Dfs.sr3.tls.secret.key={tls.key_file}",
    )  # fmt: skip
    assert wrong.returncode != 0
    assert "TLS" in wrong.stdout + wrong.stderr, wrong.stdout[-2000:]
