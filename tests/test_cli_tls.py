"""The command line against a ring that serves HTTPS only and requires client
certificates: real subprocesses, one real peer.

What it breaks: the client's TLS settings, one at a time (none, another CA's, no client
certificate, a peer certificate that does not name the address dialled). Must hold: one
``sr3:`` line that names the seeds, where they came from and why the handshake failed,
in the words of the flags beside the variables (``--tls-ca (or SR3_TLS_CA)``); and
``--tls-ca``, ``--tls-cert`` and ``--tls-key`` reach the ring as the variables do, for
records (``sr3 status``), files (``sr3 fs``) and the Spark conf (``sr3 spark conf``).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from support import client_tls, require_spark, start_cluster

from ring.tls import ClientTls
from sr3.certs import init_ca, issue
from sr3.local import LocalCluster

COMMAND_TIMEOUT_S = 60
RELOAD_S_MAX = 20.0
CHECK_INTERVAL_S = 0.5


@pytest.fixture(scope="module")
def tls_ring(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    home = tmp_path_factory.mktemp("cli-tls-ring")
    flags = ["--tls-check-interval", str(CHECK_INTERVAL_S), "--scrub-rate", "0"]
    cluster = start_cluster(home, 1, tls=True, replication=1, write_quorum=1, peer_flags=flags)
    try:
        yield cluster
    finally:
        cluster.down(purge=True)


def _flags(tls: ClientTls) -> list[str]:
    return ["--tls-ca", str(tls.ca_file), "--tls-cert", str(tls.cert_file),
            "--tls-key", str(tls.key_file)]  # fmt: skip


def _sr3(
    ring: LocalCluster, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``sr3 ARGS`` with the secret and nothing else of the ring from the environment."""
    hidden = ("SR3_RING", "SR3_SECRET", "SR3_CLUSTER_FILE", "SR3_CREDENTIAL")
    environment = {k: v for k, v in os.environ.items() if k not in hidden}
    environment = {k: v for k, v in environment.items() if not k.startswith("SR3_TLS_")}
    environment |= {"SR3_SECRET": ring.secret, "SR3_CLUSTER_FILE": "/nonexistent/cluster.json"}
    return subprocess.run(
        [sys.executable, "-m", "sr3", *args], env={**environment, **(env or {})},
        capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False,
    )  # fmt: skip


def _one_line(done: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert done.returncode == 1, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sr3: "), done.stderr
    assert "Traceback" not in done.stderr and "aiohttp" not in done.stderr, done.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_a_refused_handshake_says_why_in_one_line(tls_ring: LocalCluster, tmp_path: Path) -> None:
    """Breaks: no CA, another CA, no client certificate; the seeds from SR3_RING and
    from --ring. Must hold: the line names the seeds, their source and the reason."""
    seed, tls = tls_ring.ring, client_tls(tls_ring)
    from_env = {"SR3_RING": seed}
    plain = _sr3(tls_ring, "status", env=from_env)
    _one_line(plain, f"cannot reach {seed} (from SR3_RING): ", "set --tls-ca (or SR3_TLS_CA)")
    plain = _sr3(tls_ring, "status", "--ring", seed)
    _one_line(plain, f"cannot reach {seed} (from --ring): ", "HTTPS (TLS)")

    init_ca(tmp_path / "other")
    other = str(tmp_path / "other" / "ca.pem")
    for done in (
        _sr3(tls_ring, "status", "--tls-ca", other, env=from_env),
        _sr3(tls_ring, "status", env={**from_env, "SR3_TLS_CA": other}),
    ):
        _one_line(
            done, f"cannot reach {seed} (from SR3_RING): TLS: the peer's certificate was "
            "refused: self-signed certificate in certificate chain", "is it the cluster's?",
        )  # fmt: skip

    anonymous = _sr3(tls_ring, "status", "--tls-ca", str(tls.ca_file), env=from_env)
    _one_line(
        anonymous, f"cannot reach {seed} (from SR3_RING): ", "requires client certificates",
        "--tls-cert (or SR3_TLS_CERT)",
    )  # fmt: skip
    half = _sr3(
        tls_ring, "status", "--tls-ca", str(tls.ca_file), "--tls-cert", str(tls.cert_file),
        env=from_env,
    )  # fmt: skip
    _one_line(half, "--tls-cert (or SR3_TLS_CERT) and --tls-key (or SR3_TLS_KEY) go together")


def test_the_tls_flags_reach_the_ring_as_the_variables_do(tls_ring: LocalCluster) -> None:
    """Must hold: with the flags only (no SR3_TLS_*), ``sr3 status`` reads the ring and
    ``sr3 fs`` writes and lists a file; the variables do the same."""
    tls = client_tls(tls_ring)
    flags = ["--ring", tls_ring.ring, *_flags(tls)]
    variables = {
        "SR3_TLS_CA": str(tls.ca_file), "SR3_TLS_CERT": str(tls.cert_file),
        "SR3_TLS_KEY": str(tls.key_file), "SR3_RING": tls_ring.ring,
    }  # fmt: skip
    for status in (
        _sr3(tls_ring, "status", "--json", *flags),
        _sr3(tls_ring, "status", "--json", env=variables),
    ):
        assert status.returncode == 0, status.stderr
        peers = json.loads(status.stdout)["peers"]
        assert [(peer["id"], peer["state"]) for peer in peers] == [("peer-1", "up")]

    source = Path(tls.ca_file)  # any small file
    put = _sr3(tls_ring, "fs", "put", str(source), f"sr3:///cli-tls/{os.getpid()}.pem", *flags)
    assert put.returncode == 0, put.stderr
    listed = _sr3(tls_ring, "fs", "ls", "sr3:///cli-tls", *flags)
    assert listed.returncode == 0 and f"{os.getpid()}.pem" in listed.stdout, listed.stderr


def test_sr3_spark_conf_carries_what_the_tls_flags_name(tls_ring: LocalCluster) -> None:
    """Must hold: ``sr3 spark conf`` with the flags puts the CA, the client certificate
    and its key (under the name Spark redacts) into the conf."""
    require_spark()
    if shutil.which("javac") is None:
        pytest.skip("no javac")
    tls = client_tls(tls_ring)
    done = _sr3(tls_ring, "spark", "conf", "--json", "--ring", tls_ring.ring, *_flags(tls))
    assert done.returncode == 0, done.stderr
    conf = json.loads(done.stdout)
    assert conf["spark.hadoop.fs.sr3.tls.ca"] == tls.ca_file.read_text()
    assert tls.key_file is not None
    assert conf["spark.hadoop.fs.sr3.tls.secret.key"] == tls.key_file.read_text()


def _served_names(address: str) -> list[str]:
    """The names in the certificate the peer at ``address`` presents now."""
    host, _, port = address.rpartition(":")
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # reading the certificate, whatever it names
    with (
        socket.create_connection((host, int(port)), timeout=5) as sock,
        context.wrap_socket(sock) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    names = x509.load_der_x509_certificate(der).extensions
    san = names.get_extension_for_class(x509.SubjectAlternativeName).value
    return [str(name.value) for name in san]


def _serve(ring: LocalCluster, names: list[str]) -> None:
    """Renew the peer's certificate over its files, naming ``names``, and wait (bounded)
    until the peer serves it."""
    folder = Path(ring.cluster.tls_dir)
    issue(folder, folder, "peer-1", names)
    deadline = time.monotonic() + RELOAD_S_MAX
    while _served_names(ring.peer("peer-1").address) != names:
        assert time.monotonic() < deadline, "the peer did not load the renewed certificate"
        time.sleep(CHECK_INTERVAL_S / 2)


def test_a_certificate_that_does_not_name_the_seed_is_named_as_the_reason(
    tls_ring: LocalCluster,
) -> None:
    """Breaks: the peer's certificate is renewed with one naming another host only.
    Must hold: the line says the certificate is not valid for the address dialled."""
    seed = tls_ring.ring
    host = seed.rpartition(":")[0]
    _serve(tls_ring, ["elsewhere.invalid"])
    try:
        done = _sr3(tls_ring, "status", "--ring", seed, *_flags(client_tls(tls_ring)))
        _one_line(
            done, f"cannot reach {seed} (from --ring): TLS: the peer's certificate was refused: ",
            f"mismatch, certificate is not valid for '{host}'",
        )  # fmt: skip
    finally:
        _serve(tls_ring, [host, "localhost"])
