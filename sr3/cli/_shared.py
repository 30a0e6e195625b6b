"""What the command modules share: ring options and settings, the one error boundary,
sizes.

Every command runs inside ``fail_cleanly``: an error sr3 expects (any ``SR3Error``, and
any ``OSError`` such as a read-only or full target folder) becomes one line on stderr,
``sr3: <what>``, and exit code 1. It names where a setting came from (``--ring``,
``SR3_RING`` or the cluster file) and speaks of CLI flags (``--overwrite``), not of the
Python arguments a lower layer's message names. Anything else is a bug and keeps its
traceback; ``SR3_DEBUG=1`` shows the traceback of expected errors too.
"""

from __future__ import annotations

import errno
import functools
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click
from rich.console import Console
from rich.text import Text

from ring.config import (
    ClusterFile,
    Settings,
    cluster_file_path,
    parse_size,
    resolve,
    resolve_tls,
)
from ring.errors import PeerUnavailable, SR3Error

if TYPE_CHECKING:
    from ring.client import Client, ClientOptions

F = TypeVar("F", bound=Callable[..., Any])
stderr = Console(stderr=True)

# How OS errors read on the command line (the rest: the OS's own words, lower case).
_OS_REASONS = {
    errno.EROFS: "read-only file system",
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.ENOTDIR: "a part of the path is not a directory",
    errno.EISDIR: "is a directory",
    errno.ENOENT: "no such file or directory",
}


def fail_cleanly(function: F) -> F:
    """The CLI's error boundary: one ``sr3: <what>`` line and exit code 1 for every
    expected error (``SR3Error``, ``OSError``), a traceback only for bugs."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except (SR3Error, OSError) as exc:
            _fail_with(exc, kwargs)
        except BaseExceptionGroup as group:
            leaf = _expected_leaf(group)
            if leaf is None:
                raise
            _fail_with(leaf, kwargs)

    return wrapper  # type: ignore[return-value]


def _fail_with(exc: BaseException, kwargs: dict[str, Any]) -> NoReturn:
    if os.environ.get("SR3_DEBUG") == "1":
        raise exc
    ring_flag = kwargs.get("ring") if "ring" in kwargs else None
    fail(describe_error(exc, ring_flag=ring_flag, has_ring="ring" in kwargs))


def fail(message: str, *, exit_code: int = 1) -> NoReturn:
    """Print ``sr3: <message>`` as one line on stderr and exit."""
    one_line = " ".join(message.split())
    # One line whatever the terminal width, and the message is not rich markup.
    stderr.print(Text.assemble(("sr3:", "red"), f" {one_line}"), soft_wrap=True)
    sys.exit(exit_code)


def _expected_leaf(group: BaseExceptionGroup[Any]) -> BaseException | None:
    for leaf in _leaves(group):
        if isinstance(leaf, SR3Error | OSError):
            return leaf
    return None


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


def describe_error(exc: BaseException, *, ring_flag: str | None, has_ring: bool) -> str:
    """The one line an expected error prints, in the CLI's words."""
    if isinstance(exc, PeerUnavailable):
        return cli_wording(_describe_unreachable(exc, ring_flag, has_ring))
    if isinstance(exc, OSError) and not isinstance(exc, SR3Error):
        return describe_os_error(exc)
    return cli_wording(str(exc))


def _describe_unreachable(exc: PeerUnavailable, ring_flag: str | None, has_ring: bool) -> str:
    seeds = ring_addresses(ring_flag) if has_ring else None
    if seeds is not None and exc.address == ",".join(seeds):
        reasons = _reasons(exc, seeds)
        return f"cannot reach {exc.address} (from {ring_source(ring_flag)}): {reasons}"
    if exc.address == "ring":
        where = f" (from {ring_source(ring_flag)})" if has_ring else ""
        detail = str(exc).removeprefix("ring: ")
        return f"cannot reach any peer of the ring{where}: {detail}"
    return f"cannot reach {exc.address}: {_reasons(exc, [exc.address])}"


# The request a transport error names ("GET /v1/ring: "): the line says why, not which
# route was asked.
_REQUEST = re.compile(r"\b(?:GET|HEAD|PUT|POST|DELETE) /\S*: ")


def _reasons(exc: PeerUnavailable, addresses: list[str]) -> str:
    """Why ``addresses`` could not be reached, in the error's own words (the transport
    says why where aiohttp's error enters: refused, timed out, a name that does not
    resolve, and for TLS which end refused the handshake and why): each address's
    reason once, without the request; one address's reason alone."""
    text = str(exc).removeprefix(f"{exc.address}: ").removeprefix("no peer answered: ")
    reasons = []
    for cause in text.split("; "):
        reason = _REQUEST.sub("", cause, count=1)
        if len(addresses) == 1:
            reason = reason.removeprefix(f"{addresses[0]}: ")
        reasons.append(reason)
    return "; ".join(dict.fromkeys(reason for reason in reasons if reason)) or (
        _unreachable_reason(exc)
    )


def _unreachable_reason(exc: BaseException) -> str:
    """The innermost OS-level reason (refused, timed out) rather than aiohttp's repr,
    for an error that does not say why itself."""
    reason = "no answer"
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, TimeoutError):
            reason = "timed out"
        elif isinstance(cause, OSError) and cause.errno:
            reason = os.strerror(cause.errno).lower()
        cause = cause.__cause__ or cause.__context__
    return reason


def describe_os_error(exc: OSError, *, action: str = "", path: Path | None = None) -> str:
    """``cannot write /x/y: read-only file system`` rather than a chained traceback."""
    reason = _OS_REASONS.get(exc.errno or 0) or (
        os.strerror(exc.errno).lower() if exc.errno else str(exc)
    )
    named = path if path is not None else exc.filename
    where = f"{action} {named}".strip() if named is not None else action
    return f"{where}: {reason}" if where else reason


def cli_wording(message: str) -> str:
    """Name the running command's flags where a lower layer named its Python arguments
    (``pass overwrite=True`` reads ``pass --overwrite``, ``batch_id=3`` reads ``--batch
    3``) or the environment variable a flag stands beside (``set SR3_TLS_CA`` reads ``set
    --tls-ca (or SR3_TLS_CA)``). Why a peer was unreachable is already in words: the
    transport says it where aiohttp's error enters."""
    context = click.get_current_context(silent=True)
    if context is None:
        return message
    for param in context.command.params:
        if not isinstance(param, click.Option) or param.name is None:
            continue
        flag = max(param.opts, key=len)
        name = re.escape(param.name)
        if param.is_flag:
            message = re.sub(rf"\b{name}=True\b", flag, message)
        else:
            message = re.sub(rf"\b{name}=(?=\S)", f"{flag} ", message)
        if isinstance(param.envvar, str) and param.envvar:
            variable = re.escape(param.envvar)
            message = re.sub(rf"\b{variable}\b", f"{flag} (or {param.envvar})", message)
    return message


def ring_source(ring_flag: str | None) -> str:
    """Where the ring address came from, in the order ``ring.config.resolve`` reads."""
    if ring_flag:
        return "--ring"
    if os.environ.get("SR3_RING"):
        return "SR3_RING"
    return f"the cluster file {cluster_file_path()}"


def ring_addresses(ring_flag: str | None) -> list[str] | None:
    """The seed addresses the client was given, as ``resolve`` finds them, or None."""
    text = ring_flag or os.environ.get("SR3_RING")
    if text:
        return [seed.strip() for seed in text.split(",") if seed.strip()]
    path = cluster_file_path()
    try:
        return list(ClusterFile.read(path).addresses)
    except SR3Error:
        return None


def secret_options(function: F) -> F:
    """--ring and --secret-file: where the ring's settings come from (``sr3 token``,
    which derives from the secret and reaches no peer)."""
    function = click.option(
        "--secret-file",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="File holding the cluster secret (else SR3_SECRET, else the cluster file).",
    )(function)
    function = click.option(
        "--ring", help="host:port of one or more peers, comma-separated (else SR3_RING)."
    )(function)
    return function


# The client's TLS flags of the commands that reach a ring, each beside the variable
# ``ring.config.resolve_tls`` reads.
_TLS_FLAGS = (
    ("--tls-ca", "SR3_TLS_CA", "The cluster's CA certificate (PEM): reach the ring over HTTPS"),
    ("--tls-cert", "SR3_TLS_CERT",
     "A client certificate from the cluster's CA (PEM), for peers that require one"),
    ("--tls-key", "SR3_TLS_KEY", "The key of --tls-cert (PEM)"),
)  # fmt: skip


def _export_tls_flag(
    _context: click.Context, param: click.Parameter, value: Path | None
) -> Path | None:
    """A TLS flag given is what every client this command makes finds, as its variable
    would be: set in this process's environment (and an application the command starts
    inherits it)."""
    if value is not None and isinstance(param.envvar, str):
        os.environ[param.envvar] = str(value)
    return value


def ring_options(function: F) -> F:
    """--ring, --secret-file and the client's TLS (--tls-ca, --tls-cert, --tls-key), for
    the commands that talk to a running ring."""
    for flag, variable, help_text in reversed(_TLS_FLAGS):
        function = click.option(
            flag, envvar=variable, type=click.Path(dir_okay=False, path_type=Path),
            callback=_export_tls_flag, expose_value=False, help=f"{help_text} (else {variable}).",
        )(function)  # fmt: skip
    return secret_options(function)


def ring_settings(ring: str | None, secret_file: Path | None) -> Settings:
    secret = secret_file.read_text().strip() if secret_file else None
    return resolve(ring, secret)


def client_options(settings: Settings) -> ClientOptions:
    """A command's client options: TLS as ``Client`` finds it (``SR3_TLS_*``), or from
    the cluster file the ring came from (``sr3 cluster up --tls``)."""
    from ring.client import ClientOptions  # not at import: ``sr3 peer`` loads no client

    return ClientOptions(tls=resolve_tls(settings.cluster))


def open_client(settings: Settings) -> Client:
    """A client of the ring a command was given (``ring_settings``), with its TLS."""
    from ring.client import Client

    return Client(settings.ring, settings.secret, options=client_options(settings))


def parse_rate(text: str) -> float:
    """Bytes per second in ``64MB/s``, ``64MiB`` or ``0`` (unlimited)."""
    return float(parse_size(text.strip().removesuffix("/s")))


def human_size(size: int | None) -> str:
    """``1.5 MiB``; ``-`` when the figure is not known."""
    if size is None:
        return "-"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
