"""Lazy re-exports for a package's ``__init__``: a public name is imported from the
module that defines it on first use (PEP 562), so importing the package stays cheap.

    __getattr__, __dir__ = lazy_exports(__name__, {"Client": "ring.client", ...})

``sr3`` and ``recovery`` use it: a peer process imports ``sr3.cli`` and
``recovery.relay`` without loading the client, the executor or the local cluster.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``, whose public names (keys) live in
    the modules named by the values."""

    def getattr_(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def dir_() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exports})

    return getattr_, dir_
