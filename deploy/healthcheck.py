"""The peer image's health check (the Dockerfile's ``HEALTHCHECK``): exit 0 when the
``sr3 peer`` in this container answers its health route and has learned the member
table ("ready"), else print why and exit 1.

It reads the peer's own configuration from the environment, so one check serves every
way the image runs: ``SR3_LISTEN`` says where to knock (a wildcard address means
loopback), and with ``SR3_TLS_CERT`` it speaks HTTPS, trusting ``SR3_TLS_CA`` (else the
chain in the peer's own certificate file) and offering the peer's certificate as its
client certificate, for peers that require one (``SR3_TLS_CLIENT_CERTS``). The host name
is not checked: the certificate names the addresses others reach the peer at, and this
check reaches it on loopback. Standard library only (the image runs it every few seconds).
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import urllib.request
from collections.abc import Mapping

# Under the HEALTHCHECK's --timeout (2 s), so that a slow answer reads as this
# script's clear failure rather than the engine killing it.
TIMEOUT_S = 1.5
ANSWER_BYTES_MAX = 64 * 1024
WILDCARD_HOSTS = {"", "0.0.0.0", "::", "[::]"}


def health_url(env: Mapping[str, str]) -> str:
    """The peer's health route, from its ``SR3_LISTEN`` and whether it serves TLS."""
    listen = env.get("SR3_LISTEN", "").strip()
    host, separator, port = listen.rpartition(":")
    if not separator or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"SR3_LISTEN={listen!r}: expected HOST:PORT")
    if host in WILDCARD_HOSTS:
        host = "127.0.0.1" if ":" not in host else "[::1]"
    scheme = "https" if env.get("SR3_TLS_CERT") else "http"
    return f"{scheme}://{host}:{port}/v1/health"


def tls_context(env: Mapping[str, str]) -> ssl.SSLContext | None:
    """The client side of the peer's TLS, or None when it serves plain HTTP."""
    cert = env.get("SR3_TLS_CERT")
    if not cert:
        return None
    context = ssl.create_default_context(cafile=env.get("SR3_TLS_CA") or cert)
    context.check_hostname = False
    key = env.get("SR3_TLS_KEY")
    if key:
        context.load_cert_chain(cert, key)
    return context


def check(env: Mapping[str, str]) -> str | None:
    """None when the peer is ready, else why not (one line)."""
    try:
        url = health_url(env)
        context = tls_context(env)
        with urllib.request.urlopen(url, timeout=TIMEOUT_S, context=context) as answer:
            health = json.loads(answer.read(ANSWER_BYTES_MAX))
    except (OSError, ValueError) as exc:
        return f"no health answer: {exc}"
    if not isinstance(health, dict) or health.get("ready") is not True:
        return f"not ready yet: {health}"
    return None


def main() -> int:
    problem = check(os.environ)
    if problem is not None:
        print(problem)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
