"""A cluster's own certificate authority and the certificates it issues (``sr3 tls``).

``init_ca`` makes the CA: an ECDSA P-256 key (``ca.key``, mode 0600, which never leaves
the operator's machine: peers and clients get ``ca.pem`` only) and a self-signed CA
certificate. ``issue`` makes a certificate for a peer or a client: a new P-256 key and a
certificate naming every host name and IP it is reached at (subject alternative
names), usable both to serve and to connect (peers are clients of each other), signed
by the CA. The ``cryptography`` package does the cryptography; ``ring.tls`` loads the
files with the standard library.

Files: ``<name>.pem`` (the certificate, then the CA's: a full chain) and ``<name>.key``
(mode 0600). Renewing is issuing again over the same files: a peer loads the new ones
within ``ring.tls.CERT_CHECK_INTERVAL_S`` without a restart. ``names_missing`` says
which names a certificate lacks, so a deployment re-issues it only when a name is added
(docker-compose.yml's ``tls`` service).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ring.errors import ConfigError

__all__ = [
    "CA_DAYS_DEFAULT",
    "CERT_DAYS_DEFAULT",
    "CaFiles",
    "Issued",
    "init_ca",
    "issue",
    "names_missing",
]

CA_DAYS_DEFAULT = 3650
# Under the 398 days browsers accept; peers reload renewals without a restart.
CERT_DAYS_DEFAULT = 365
SANS_MAX = 64
# Clock skew between the machine that issues and the machines that check.
_BACKDATE = datetime.timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class CaFiles:
    cert: Path
    key: Path


@dataclass(frozen=True, slots=True)
class Issued:
    cert: Path
    key: Path
    not_after: datetime.datetime


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _write(path: Path, data: bytes, mode: int) -> None:
    """Replace ``path`` with ``data`` whole (a temp file, fsynced, renamed over it),
    created with ``mode``: 0o600 for a key, 0o644 for a certificate."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    """Signing, and for the CA signing certificates: what each kind of key may do."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def ca_files(directory: Path) -> CaFiles:
    return CaFiles(directory / "ca.pem", directory / "ca.key")


def init_ca(
    directory: Path, *, days: int = CA_DAYS_DEFAULT, name: str = "sr3 cluster CA"
) -> CaFiles:
    """Make a new CA in ``directory``; refuses to replace one that is there."""
    files = ca_files(directory)
    if files.cert.exists() or files.key.exists():
        raise ConfigError(f"{directory} already holds a CA (ca.pem, ca.key): not replaced")
    if not 1 <= days <= 36500:
        raise ConfigError("a CA lives 1 to 36500 days")
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _now()
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            _key_usage(ca=True),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write(files.key, _key_pem(key), 0o600)
    _write(files.cert, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return files


def _load_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    files = ca_files(directory)
    try:
        cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
        key = serialization.load_pem_private_key(files.key.read_bytes(), password=None)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load the CA in {directory}: {exc}") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ConfigError(f"{files.key} is not an EC key made by `sr3 tls init`")
    return cert, key


def _san(text: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(text))
    except ValueError:
        pass
    # A wildcard stands for one leftmost label (a StatefulSet's pods:
    # *.sr3-peers.<namespace>.svc.cluster.local).
    name = text[2:] if text.startswith("*.") else text
    labels = name.split(".")
    if (
        not name
        or len(text) > 253
        or not all(
            part and len(part) <= 63 and part.replace("-", "").replace("_", "").isalnum()
            for part in labels
        )
        or (name != text and len(labels) < 2)
    ):
        raise ConfigError(f"{text!r} is neither an IP address nor a host name")
    return x509.DNSName(text)


def issue(
    ca_dir: Path,
    out_dir: Path,
    name: str,
    sans: Sequence[str],
    *,
    days: int = CERT_DAYS_DEFAULT,
    valid_from: datetime.datetime | None = None,
) -> Issued:
    """A certificate named ``name`` for the hosts ``sans`` (names and IPs), signed by
    the CA in ``ca_dir``, written to ``out_dir`` (replacing one of that name: a
    renewal). ``valid_from``: its start (default now, less five minutes of skew)."""
    if not sans or len(sans) > SANS_MAX:
        raise ConfigError(f"a certificate names 1 to {SANS_MAX} hosts (--san)")
    if not 1 <= days <= 3650:
        raise ConfigError("a certificate lives 1 to 3650 days")
    if not name or not all(c.isalnum() or c in "-_." for c in name):
        raise ConfigError(f"{name!r}: a certificate name is letters, digits, '-', '_', '.'")
    ca_cert, ca_key = _load_ca(ca_dir)
    alt_names = [_san(host) for host in dict.fromkeys(sans)]
    key = ec.generate_private_key(ec.SECP256R1())
    start = valid_from if valid_from is not None else _now() - _BACKDATE
    not_after = start + datetime.timedelta(days=days)
    if not_after > ca_cert.not_valid_after_utc:
        raise ConfigError(f"the CA expires at {ca_cert.not_valid_after_utc}, before {not_after}")
    public = key.public_key()
    ca_public = ca_cert.public_key()
    assert isinstance(ca_public, ec.EllipticCurvePublicKey)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            _key_usage(ca=False),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_public), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM)
    pem += ca_cert.public_bytes(serialization.Encoding.PEM)
    issued = Issued(out_dir / f"{name}.pem", out_dir / f"{name}.key", not_after)
    # The key first: a peer that reloads between the two writes finds a pair that
    # does not match, keeps its current one and loads the new pair on its next look.
    _write(issued.key, _key_pem(key), 0o600)
    _write(issued.cert, pem, 0o644)
    return issued


def _covers(pattern: str, name: str) -> bool:
    """Whether a certificate's DNS name covers ``name`` (a wildcard: one leftmost label)."""
    pattern, name = pattern.lower(), name.lower()
    if pattern.startswith("*."):
        head, _, rest = name.partition(".")
        return bool(head) and rest == pattern[2:]
    return pattern == name


def names_missing(cert_file: Path, names: Sequence[str]) -> list[str]:
    """Those of ``names`` (host names and IPs, as ``issue`` takes them) that the
    certificate in ``cert_file`` does not name, in the order given: IPs compared as
    addresses, host names without regard to case."""
    try:
        cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the certificate {cert_file}: {exc}") from exc
    try:
        alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return list(dict.fromkeys(names))
    addresses = set(alt.get_values_for_type(x509.IPAddress))
    patterns = alt.get_values_for_type(x509.DNSName)
    missing = []
    for name in dict.fromkeys(names):
        try:
            named = ipaddress.ip_address(name) in addresses
        except ValueError:
            named = any(_covers(pattern, name) for pattern in patterns)
        if not named:
            missing.append(name)
    return missing
