"""The process groups sr3's demos and drills start (an application with its JVM and its
Python workers): which of their processes still run, and killing one whole."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from ring.errors import SR3Error

__all__ = ["GROUP_EXIT_S_MAX", "group_alive", "group_pids", "kill_group", "log_tail"]

# How long a killed group may take to be gone (the leader reaped, every member exited).
GROUP_EXIT_S_MAX = 10.0
POLL_S = 0.05
_PROC = Path("/proc")


def group_pids(group_id: int) -> list[int]:
    """The live processes of a group (zombies left out), from ``/proc`` (empty where
    there is none: ``group_alive`` tells whether the group runs there)."""
    pids = []
    for stat_path in _PROC.glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError):
            # "pid (comm) state ppid pgrp ...": comm may hold spaces, so split after ")".
            state, _ppid, group = stat_path.read_text().rpartition(")")[2].split()[:3]
            if int(group) == group_id and state not in ("Z", "X"):
                pids.append(int(stat_path.parent.name))
    return pids


def group_alive(group_id: int) -> bool:
    """Whether a process of the group still runs (zombies waiting for a reaper do not,
    where ``/proc`` tells them apart)."""
    if _PROC.is_dir():
        return bool(group_pids(group_id))
    try:
        os.killpg(group_id, 0)
    except ProcessLookupError:
        return False
    return True


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL every process of the group ``process`` leads, reap it, and wait until no
    process of the group runs."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    try:
        process.wait(GROUP_EXIT_S_MAX)
    except subprocess.TimeoutExpired:
        raise SR3Error(f"process {process.pid} still runs after SIGKILL") from None
    deadline = time.monotonic() + GROUP_EXIT_S_MAX
    while group_alive(process.pid):
        if time.monotonic() > deadline:
            raise SR3Error(f"process group {process.pid} still runs after SIGKILL")
        time.sleep(POLL_S)


def log_tail(log_path: Path, lines: int, shown: str | None = None) -> str:
    """The last ``lines`` lines of an application's log under a heading that names it
    (``shown``, else its path), for an error that says why the application failed;
    empty when the log cannot be read."""
    try:
        text = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join([f"--- last lines of {shown or log_path}:", *text[-lines:]])
