"""Scoped credentials: what an executor holds instead of the cluster secret.

What must hold: the credential is derived from the secret and its claims alone (the
vector below is computed independently, the Java client checks the same one); peers
verify it from the secret, refuse it expired, tampered or malformed (401), and let it
reach only the file namespace under its prefix and the member table (403 elsewhere,
400 for a path that is not one); the cluster secret keeps full access.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import random
import time
from collections.abc import Awaitable, Callable
from functools import partial
from urllib.parse import quote

import pytest
from support import HttpProbe

from ring import api, fs_api, records_api
from ring.auth import parse_credential, scoped_credential
from ring.client import Client
from ring.errors import Fenced, ProtocolError
from ring.lease import first_lease
from spark_connector.fs_client import FsClient, FsRefused
from sr3.local import LocalCluster

SECRET = "vector-secret-of-thirty-two-char"
VECTOR_CLAIMS = '{"expires":1800000000,"issued":1700000000,"prefix":"/spark/sessions"}'


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def test_the_credential_is_derived_from_the_secret_and_its_claims() -> None:
    claims = _b64(VECTOR_CLAIMS.encode())
    root = hmac.new(SECRET.encode(), b"sr3-scoped-v1", hashlib.sha256).digest()
    key = hmac.new(root, claims.encode(), hashlib.sha256).digest()
    expected = f"sr3c1.{claims}.{_b64(key)}"
    made = scoped_credential(
        SECRET, "spark/sessions/", expires_at=1_800_000_000, issued_at=1_700_000_000
    )
    assert made == expected
    parsed = parse_credential(made)
    assert (parsed.prefix, parsed.expires, parsed.key) == ("/spark/sessions", 1_800_000_000, key)


@pytest.mark.parametrize(
    "text",
    ["", "sr3c1.", "sr3c1.abc", "sr3c2.e30.AAAA", "sr3c1.!!.AAAA", "sr3c1.e30." + "A" * 43],
)
def test_malformed_credentials_are_refused(text: str) -> None:
    with pytest.raises(ProtocolError):
        parse_credential(text)


def _credential(secret: str, prefix: str, *, expires_in_s: int = 3600) -> str:
    now = int(time.time())
    return scoped_credential(secret, prefix, expires_at=now + expires_in_s, issued_at=now - 10)


async def test_a_scoped_credential_reaches_only_files_under_its_prefix(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: a credential scoped to /scoped/<n> used on every other route. Must hold:
    files under its prefix work; outside it (including rename with one side outside)
    is 403 "forbidden"; chunks, records, consensus, admin and metrics routes are 403."""
    prefix = f"/scoped/{rng.randrange(10**9)}"
    credential = _credential(ring.secret, prefix)
    address = ring.cluster.addresses[0]
    async with FsClient(ring.ring, ring.secret) as admin:
        await admin.write("/elsewhere/secret.txt", b"not yours", overwrite=True)
    async with FsClient(ring.ring, credential) as fs:
        await fs.write(f"{prefix}/a/b.txt", b"mine")
        assert await fs.read(f"{prefix}/a/b.txt") == b"mine"
        assert [s.name for s in await fs.list(f"{prefix}/a")] == ["b.txt"]
        await fs.rename(f"{prefix}/a/b.txt", f"{prefix}/c.txt")
        for attempt in (
            fs.read("/elsewhere/secret.txt"),
            fs.stat("/elsewhere"),
            fs.list("/"),
            fs.write(f"{prefix}-sibling/x", b"x"),
            fs.rename(f"{prefix}/c.txt", "/elsewhere/c.txt"),
            fs.delete("/elsewhere", recursive=True),
        ):
            with pytest.raises(FsRefused) as refused:
                await attempt
            assert refused.value.status == 403, refused.value
    async with HttpProbe(credential) as probe:
        for method, path in (
            ("GET", "/v1/info"),
            ("GET", "/v1/members"),
            ("GET", "/metrics"),
            ("GET", "/v1/chunks/" + "0" * 32),
            ("GET", "/v1/records?prefix=&limit=10"),
            ("GET", records_api.record_path("files/elsewhere/secret.txt")),
            ("POST", "/v1/admin/leave"),
            ("POST", "/v1/records/versions"),
        ):
            answer = await probe.signed(address, method, path)
            assert answer.status == 403, (method, path, answer.status, answer.body[:200])
        assert (await probe.signed(address, "GET", "/v1/ring")).status == 200
        encoded = fs_api.FS_STAT.pattern.replace("{path:.*}", prefix[1:] + "/..%2F..%2Felsewhere")
        assert (await probe.signed(address, "GET", encoded)).status in (400, 403)
    async with FsClient(ring.ring, ring.secret) as admin:
        assert await admin.read("/elsewhere/secret.txt") == b"not yours"
        assert await admin.read(f"{prefix}/c.txt") == b"mine"


async def test_a_scoped_credential_fences_only_with_leases_under_its_prefix(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: a credential scoped to /scoped/<n> fences its writes with lease records
    outside its prefix, one held, one a file's record (was: the peer read any record
    the request named and answered who holds it, or whether the file exists). Must
    hold: a fenced PUT, rename or delete naming a lease outside is 403 "forbidden" and
    changes nothing; one naming ``scoped/<n>/lease`` (the lease under its prefix) is
    checked against it as ever; the cluster secret may name any lease."""
    number = rng.randrange(10**9)
    prefix, own, other = f"/scoped/{number}", f"scoped/{number}/lease", f"spark/q{number}/lease"
    credential = _credential(ring.secret, prefix)
    lease = first_lease("driver-a", 30.0, time.time()).encode()
    async with Client(ring.ring, ring.secret) as client, FsClient(ring.ring, ring.secret) as admin:
        await client.put_record(own, lease, expected_version=0)
        await client.put_record(other, lease, expected_version=0)
        await admin.write(f"{prefix}/kept", b"kept")
        await admin.write(f"{prefix}/by-admin", b"x", fence=(other, 1))
    async with FsClient(ring.ring, credential) as fs:
        await fs.write(f"{prefix}/commits/0", b"commit 0", fence=(own, 1))
        with pytest.raises(Fenced):
            await fs.write(f"{prefix}/commits/1", b"commit 1", fence=(own, 2))
        for outside in (other, f"scoped/{number}-sibling/lease", "spark"):
            fence = (outside, 1)
            attempts: list[Callable[[], Awaitable[object]]] = [
                partial(fs.write, f"{prefix}/commits/1", b"commit 1", fence=fence),
                partial(fs.rename, f"{prefix}/kept", f"{prefix}/moved", fence=fence),
                partial(fs.delete, f"{prefix}/kept", fence=fence),
            ]
            for attempt in attempts:
                with pytest.raises(FsRefused) as refused:
                    await attempt()
                assert (refused.value.status, refused.value.code) == (403, "forbidden"), outside
        assert await fs.read(f"{prefix}/kept") == b"kept"
        assert not await fs.exists(f"{prefix}/commits/1")
        assert not await fs.exists(f"{prefix}/moved")
    async with HttpProbe(credential) as probe:
        file_record = quote(fs_api.path_key("/elsewhere/secret.txt"), safe="")
        put = fs_api.fs_path(fs_api.FS_WRITE, f"{prefix}/x") + f"?lease={file_record}&fence=1"
        answer = await probe.signed(ring.cluster.addresses[0], "PUT", put, body=b"x")
        assert answer.status == 400, answer.body[:200]


async def test_expired_tampered_and_foreign_credentials_get_401(ring: LocalCluster) -> None:
    """Must hold: an expired credential, one whose claims were widened (to the whole
    namespace) and one derived from another secret are refused with 401; the peer
    stays up."""
    address = ring.cluster.addresses[1]
    _scheme, _claims, key = _credential(ring.secret, "/spark").split(".")
    widened = json.loads(VECTOR_CLAIMS) | {"prefix": "/", "expires": int(time.time()) + 3600}
    wider = _b64(json.dumps(widened, separators=(",", ":"), sort_keys=True).encode())
    path = fs_api.fs_path(fs_api.FS_STAT, "/spark")
    for credential in (
        _credential(ring.secret, "/spark", expires_in_s=-5),
        f"sr3c1.{wider}.{key}",
        _credential("another-secret-of-enough-length", "/spark"),
    ):
        async with HttpProbe(credential) as probe:
            answer = await probe.signed(address, "GET", path)
            assert answer.status == 401, (credential[:40], answer.body[:200])
            assert (await probe.send(address, "GET", api.HEALTH.pattern)).status == 200
