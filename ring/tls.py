"""TLS for every HTTP hop: the contexts a peer serves with and a client (or a peer, as a
client of other peers) connects with, from PEM files, and a reloader that picks up
renewed certificates without a restart.

The cluster has a CA of its own (``sr3 tls init``); each peer a certificate from it
naming every address it advertises (``sr3 tls issue``), usable to serve and, when peers
require client certificates, to connect. A client trusts the cluster's CA bundle only,
and checks that a peer's certificate names the host it dialled. HMAC request signing
and scoped credentials stay the authorization layer; TLS is the privacy and integrity
of the wire, and, with client certificates, who may open a connection at all.

The standard library's ``ssl`` does all of it; nothing here parses certificates.
Python's ``SSLContext.load_cert_chain`` on a context in use changes the certificate
that later handshakes present (connections already open keep theirs), which is what
the reloader relies on.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ring.errors import ConfigError

__all__ = [
    "CERT_CHECK_INTERVAL_S",
    "ClientTls",
    "ServerTls",
    "client_context",
    "describe_tls_error",
    "server_context",
]

log = logging.getLogger(__name__)

# How often a peer looks at its certificate and key files for a renewal.
CERT_CHECK_INTERVAL_S = 60.0
_MINIMUM = ssl.TLSVersion.TLSv1_2


@dataclass(frozen=True, slots=True)
class ServerTls:
    """A peer's TLS: its certificate chain and key (PEM), the cluster CA bundle it
    trusts for its own connections to other peers and for client certificates, and
    whether a client must present a certificate from that CA."""

    cert_file: Path
    key_file: Path
    ca_file: Path
    require_client_cert: bool = False
    # How often the files are looked at for a renewal (``CertificateReloader``).
    check_interval_s: float = CERT_CHECK_INTERVAL_S

    @property
    def as_client(self) -> ClientTls:
        """What the peer connects to other peers with: the same CA, and its own
        certificate as the client certificate peers may require."""
        return ClientTls(self.ca_file, self.cert_file, self.key_file)


@dataclass(frozen=True, slots=True)
class ClientTls:
    """What a client connects with: the CA bundle it trusts and, when peers require
    one, its own certificate and key."""

    ca_file: Path
    cert_file: Path | None = None
    key_file: Path | None = None


def _load_chain(context: ssl.SSLContext, cert_file: Path, key_file: Path) -> None:
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"cannot load the certificate {cert_file} with its key {key_file}: {_words(exc)}"
        ) from exc


def _load_ca(context: ssl.SSLContext, ca_file: Path) -> None:
    try:
        context.load_verify_locations(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the CA bundle {ca_file}: {_words(exc)}") from exc


def server_context(tls: ServerTls) -> ssl.SSLContext:
    """The context a peer serves HTTPS with."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _MINIMUM
    _load_chain(context, tls.cert_file, tls.key_file)
    if tls.require_client_cert:
        _load_ca(context, tls.ca_file)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(tls: ClientTls) -> ssl.SSLContext:
    """The context a client (or a peer calling another) connects with: the cluster CA
    only, host names checked, and its own certificate when it has one."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = _MINIMUM
    context.check_hostname = True
    context.verify_mode = ssl.CERT_REQUIRED
    _load_ca(context, tls.ca_file)
    if tls.cert_file is not None:
        if tls.key_file is None:
            raise ConfigError("a client certificate needs its key file too")
        _load_chain(context, tls.cert_file, tls.key_file)
    return context


def _words(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return exc.reason.lower().replace("_", " ")
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__


def describe_tls_error(exc: BaseException) -> str | None:
    """One line for a failed TLS handshake ("certificate verify failed: certificate has
    expired"), or None when ``exc`` is not one."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        # aiohttp wraps the ssl module's errors (``certificate_error``, ``os_error``).
        inner = getattr(cause, "certificate_error", None) or getattr(cause, "os_error", None)
        if isinstance(inner, BaseException) and id(inner) not in seen:
            cause = inner
            continue
        if isinstance(cause, ssl.SSLCertVerificationError):
            detail = getattr(cause, "verify_message", None) or _words(cause)
            if "self-signed" in detail or "issuer" in detail:
                detail += " (it is not from the CA this client trusts: is it the cluster's?)"
            return f"TLS: the peer's certificate was refused: {detail}"
        if isinstance(cause, ssl.SSLError):
            reason = _words(cause)
            if "wrong version number" in reason or "record layer failure" in reason:
                return "TLS: the peer does not speak TLS (is it serving plain HTTP?)"
            if "certificate" in reason or "alert" in reason:
                return (
                    f"TLS: the peer refused the handshake ({reason}): a client "
                    "certificate from the cluster's CA may be required"
                )
            return f"TLS: {reason}"
        cause = cause.__cause__ or cause.__context__
    return None


class CertificateReloader:
    """Reloads a serving context's certificate and key when their files change (a
    renewal written in place or renamed over), checking every ``check_interval_s``; a
    renewal that does not load is logged and the current certificate kept."""

    def __init__(
        self,
        context: ssl.SSLContext,
        tls: ServerTls,
        *,
        on_reload: Callable[[], None] | None = None,
    ) -> None:
        self._context = context
        self._tls = tls
        self._interval_s = tls.check_interval_s
        self._on_reload = on_reload
        self._stamp = self._files_stamp()
        self.reloads = 0

    def _files_stamp(self) -> tuple[float, int, float, int] | None:
        try:
            cert, key = os.stat(self._tls.cert_file), os.stat(self._tls.key_file)
        except OSError:
            return None
        return (cert.st_mtime, cert.st_ino, key.st_mtime, key.st_ino)

    def check(self) -> bool:
        """Reload if the files changed since the last look; whether it reloaded."""
        stamp = self._files_stamp()
        if stamp is None or stamp == self._stamp:
            return False
        try:
            _load_chain(self._context, self._tls.cert_file, self._tls.key_file)
        except ConfigError as exc:
            log.error("tls: keeping the current certificate: %s", exc)
            return False
        self._stamp = stamp
        self.reloads += 1
        log.info("tls: loaded the renewed certificate %s", self._tls.cert_file)
        if self._on_reload is not None:
            self._on_reload()
        return True

    async def run(self) -> None:
        """Check every ``check_interval_s`` until cancelled."""
        while True:
            await asyncio.sleep(self._interval_s)
            # On the loop: the context is in use by handshakes on this thread.
            self.check()
