"""The ``sr3`` command line: the root group and the table of its commands.

    sr3 peer ...                    run one storage peer in the foreground
    sr3 peer leave PEER             make a peer leave the ring for good
    sr3 cluster up --peers N        start the embedded local cluster (127.0.0.x)
    sr3 cluster down [--purge]      stop it
    sr3 cluster kill|start PEER     SIGKILL or (re)start one local peer
    sr3 status [--json]             peers, state, ownership, stored bytes, chunks
    sr3 put FILE [--key NAME]       store a file; prints the key
    sr3 get KEY -o FILE             read it back, verified
    sr3 ls [PREFIX]                 the named files: key, size, version
    sr3 rm KEY...                   delete named files
    sr3 token metrics               the bearer token Prometheus scrapes /metrics with
    sr3 token scoped --prefix P     a credential reaching only sr3:// paths under P
    sr3 fs ls|cat|get|put|mv|rm|du  the sr3:// namespace Spark's executors write
    sr3 spark list|restore|forget   Spark queries' state on the ring (and sr3:// checkpoints)
    sr3 spark conf                  --conf flags for spark-submit to use sr3://
    sr3 spark standby --query Q     drive a query, or stand by to take it over
    sr3 drill                       rehearse a multi-failure recovery
    sr3 drill --spark-standby       rehearse a driver's loss with a standby taking over
    sr3 demo                        the end-to-end demonstration on a local cluster

Ring and secret come from --ring/--secret-file, then SR3_RING/SR3_SECRET, then the
cluster file written by ``sr3 cluster up``. Every command fails the same way
(``sr3.cli._shared.fail_cleanly``): one ``sr3: <what>`` line on stderr and exit code 1.

Each command group lives in its own module and is imported when the command is looked
up, so a peer started as ``python -m sr3 peer`` loads neither the client nor the local
cluster it never uses.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import click

from ring.heap import keep_buffers

__all__ = ["cli", "main"]

# Command name -> "module:attribute" that defines it.
_COMMANDS = {
    "cluster": "sr3.cli.cluster:cluster",
    "demo": "sr3.cli.demo:demo",
    "drill": "sr3.cli.drill:drill",
    "fs": "sr3.cli.fs:fs",
    "get": "sr3.cli.data:get",
    "ls": "sr3.cli.data:ls",
    "peer": "sr3.cli.peer:peer",
    "put": "sr3.cli.data:put",
    "rm": "sr3.cli.data:rm",
    "spark": "sr3.cli.spark:spark",
    "status": "sr3.cli.data:status",
    "tls": "sr3.cli.tls:tls",
    "token": "sr3.cli.data:token",
}


class _LazyGroup(click.Group):
    """A group that imports a command's module the first time the command is looked up."""

    def __init__(self, *args: Any, lazy_commands: Mapping[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands = dict(lazy_commands)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None or cmd_name not in self.lazy_commands:
            return command
        module, _, name = self.lazy_commands[cmd_name].partition(":")
        command = getattr(importlib.import_module(module), name)
        if not isinstance(command, click.Command) or command.name != cmd_name:
            raise AssertionError(f"{self.lazy_commands[cmd_name]} is not command {cmd_name!r}")
        self.add_command(command)
        return command


@click.group(cls=_LazyGroup, lazy_commands=_COMMANDS)
@click.version_option(package_name="sr3")
def cli() -> None:
    """sr3: replicated state recovery for stream processing."""


def main() -> None:
    # Every sr3 command is a process of its own: peers, and the commands that move
    # chunks (``data``, ``spark restore``), reuse their chunk buffers (``ring.heap``).
    keep_buffers()
    cli(prog_name="sr3")
