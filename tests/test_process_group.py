"""Killing a process group the demos and drills started: every member is gone, not
only its leader (a Spark driver leaves its JVM and Python workers behind otherwise)."""

from __future__ import annotations

import subprocess
import sys

from sr3.process_group import group_alive, group_pids, kill_group

# A leader that starts two children of its own, then waits on them.
LEADER = """
import subprocess, sys, time
children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
            for _ in range(2)]
print("ready", flush=True)
time.sleep(120)
"""


def test_kill_group_leaves_no_member_of_the_group_running() -> None:
    """Breaks: a group of a leader and two children is killed. Must hold: before, the
    group has three live processes; after ``kill_group`` returns, none (the children
    too, not only the leader that was waited for)."""
    leader = subprocess.Popen(
        [sys.executable, "-c", LEADER], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert leader.stdout is not None
        assert leader.stdout.readline().strip() == b"ready"
        assert len(group_pids(leader.pid)) == 3
        assert group_alive(leader.pid)
        kill_group(leader)
        assert group_pids(leader.pid) == []
        assert not group_alive(leader.pid)
        assert leader.returncode is not None
    finally:
        leader.kill()
        leader.wait()
        if leader.stdout is not None:
            leader.stdout.close()
