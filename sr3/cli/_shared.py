"""What the command modules share: ring options and settings, clean errors, sizes."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.text import Text

from ring.config import Settings, parse_size, resolve
from ring.errors import SR3Error

F = TypeVar("F", bound=Callable[..., Any])
stderr = Console(stderr=True)


def fail_cleanly(function: F) -> F:
    """Turn sr3 errors into one line on stderr and exit code 1, not a traceback."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except SR3Error as exc:
            # One line whatever the terminal width, and the message is not rich markup.
            stderr.print(Text.assemble(("error:", "red"), f" {exc}"), soft_wrap=True)
            sys.exit(1)

    return wrapper  # type: ignore[return-value]


def ring_options(function: F) -> F:
    """--ring and --secret-file, for the commands that talk to a running ring."""
    function = click.option(
        "--secret-file",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="File holding the cluster secret (else SR3_SECRET, else the cluster file).",
    )(function)
    function = click.option(
        "--ring", help="host:port of one or more peers, comma-separated (else SR3_RING)."
    )(function)
    return function


def ring_settings(ring: str | None, secret_file: Path | None) -> Settings:
    secret = secret_file.read_text().strip() if secret_file else None
    return resolve(ring, secret)


def parse_rate(text: str) -> float:
    """Bytes per second in ``64MB/s``, ``64MiB`` or ``0`` (unlimited)."""
    return float(parse_size(text.strip().removesuffix("/s")))


def human_size(size: int | None) -> str:
    value = float(size or 0)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
