"""The fault lab's scenarios over many seeds, longer than the test suite runs them, into
one JSON report (``make faults``).

Each nemesis of ``tests/faultlab.py`` (the same scenario code ``tests/test_faults.py``
runs once each, short) runs ``--seeds`` times with its durations multiplied by
``--scale``, each run on a fresh lab of seven network namespaces (root, ``ip`` and
``nft``: see ``tests/netlab.py``). Per nemesis the report counts the runs, the calls,
how each side's calls went (over the whole run and while the nemesis lasted), and lists
every violation and harness error with the scenario seed that replays it::

    make faults                              # SR3_FAULT_SEEDS=20 SR3_FAULT_SCALE=2
    make faults SR3_FAULT_SEEDS=5 SR3_FAULT_NEMESES=bridge,flapping
    python benchmarks/fault_runs.py --nemesis minority-partition --scenario-seed 123 --scale 1

A run that found something keeps its histories and logs (under ``--work``, printed); the
others are deleted. Seeds: run ``i`` of a nemesis draws its scenario seed from the base
seed (``--seed``, else ``SR3_TEST_SEED``, else a fresh one), the nemesis and ``i``.
SIGTERM (or Ctrl-C) tears the current lab down before exiting.

The peers and clients run the ``ring`` and ``sr3`` that Python finds, this checkout's
unless ``PYTHONPATH`` names another: to test one commit while the tree changes, extract
it (``git archive``) and run its copy of this script with ``PYTHONPATH`` set to it. The
report names the commit (``--commit``, else ``git rev-parse``, marked dirty when
``ring/``, ``recovery/``, ``filesystem/`` or ``sr3/`` have changes).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))  # the scenario code, imported by name as the tests do

from faultlab import NEMESES, FaultLabError, Report, run_scenario  # noqa: E402
from netlab import NetLabError, netlab_unavailable  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
# The packages the peers and clients run: a report's commit is "+dirty" when they changed.
CODE_UNDER_TEST = ("ring", "recovery", "filesystem", "sr3")
SEEDS_DEFAULT = 20
SCALE_DEFAULT = 2.0
FIGURE_NAMES = (
    "calls", "answered", "acknowledged", "conflicts", "reads", "unknown", "failed_reads",
)  # fmt: skip


def side_totals(reports: Sequence[Report], phases: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per side: the sum of each figure over the runs and the given phases, the calls
    that got no decision from a quorum, and the shares answered and decided."""
    totals: dict[str, dict[str, Any]] = {}
    for report in reports:
        for side, by_phase in report.sides.items():
            side_total = totals.setdefault(side, dict.fromkeys([*FIGURE_NAMES, "unavailable"], 0))
            for phase in phases:
                figures = by_phase[phase]
                for name in [*FIGURE_NAMES, "unavailable"]:
                    side_total[name] += getattr(figures, name)
    for side_total in totals.values():
        calls = max(1, side_total["calls"])
        side_total["answered_share"] = round(side_total["answered"] / calls, 4)
        side_total["decided_share"] = round(1 - side_total["unavailable"] / calls, 4)
    return totals


def summarize(reports: list[Report], errors: list[dict[str, Any]]) -> dict[str, Any]:
    violations = [
        {"seed": report.seed, "text": text, "kept": report.home}
        for report in reports
        for text in report.violations
    ]
    return {
        "runs": len(reports) + len(errors),
        "runs_completed": len(reports),
        "operations": sum(f.calls for r in reports for p in r.sides.values() for f in p.values()),
        "by_side": side_totals(reports, ("before", "during", "after", "final")),
        "by_side_during_nemesis": side_totals(reports, ("during",)),
        "violations": violations,
        "failed_seeds": sorted({v["seed"] for v in violations}),
        "errors": errors,
        "duration_s": round(sum(report.duration_s for report in reports), 1),
        "figures": [{"seed": report.seed, **report.figures} for report in reports],
    }


def scenario_seeds(base: int, nemesis: str, count: int) -> list[int]:
    return [random.Random(f"{base}/{nemesis}/{i}").randrange(2**32) for i in range(count)]


def run_nemesis(
    nemesis: str, seeds: Sequence[int], scale: float, work: Path
) -> tuple[list[Report], list[dict[str, Any]]]:
    reports: list[Report] = []
    errors: list[dict[str, Any]] = []
    for number, seed in enumerate(seeds, start=1):
        home = work / f"{nemesis}-{seed}"
        home.mkdir(parents=True, exist_ok=True)
        try:
            report = run_scenario(nemesis, seed, home, scale=scale)
        except (FaultLabError, NetLabError, OSError) as exc:
            errors.append({"seed": seed, "text": str(exc)[-4000:], "kept": str(home)})
            print(f"{nemesis} {number}/{len(seeds)} seed {seed}: harness error, kept {home}")
            continue
        reports.append(report)
        verdict = f"{len(report.violations)} violation(s)" if report.violations else "ok"
        print(f"{nemesis} {number}/{len(seeds)} seed {seed}: {verdict} ({report.duration_s:.0f} s)")
        if report.violations:
            print(report.describe())
        else:
            shutil.rmtree(home, ignore_errors=True)
    return reports, errors


def commit_of(root: Path) -> str:
    """The checkout's commit, "+dirty" when the code under test has changes; "unknown"
    outside a git checkout (an extracted copy: pass ``--commit``)."""
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=True, timeout=10,
        ).stdout.strip()  # fmt: skip
        changes = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", *CODE_UNDER_TEST],
            capture_output=True, text=True, check=True, timeout=10,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}+dirty" if changes else head


def stop_on_sigterm() -> None:
    """SIGTERM ends the run as Ctrl-C does: the lab in use is torn down on the way out."""

    def stop(_signum: int, _frame: object) -> None:
        raise SystemExit(143)

    signal.signal(signal.SIGTERM, stop)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--seeds", type=int, default=SEEDS_DEFAULT, help="runs per nemesis")
    parser.add_argument("--scale", type=float, default=SCALE_DEFAULT, help="duration factor")
    parser.add_argument("--nemesis", action="append", choices=sorted(NEMESES), default=[])
    parser.add_argument("--seed", type=int, help="base seed (default: SR3_TEST_SEED or fresh)")
    parser.add_argument("--scenario-seed", type=int, help="run exactly this scenario seed")
    parser.add_argument("--out", type=Path, default=RESULTS / "faults.json")
    parser.add_argument("--work", type=Path, help="where runs keep their files")
    parser.add_argument("--commit", help="the commit under test (default: from git)")
    options = parser.parse_args(argv)
    if options.seeds < 1 or options.scale < 1:
        parser.error("--seeds is at least 1 and --scale at least 1 (the cut outlasts the grace)")
    return options


def main(argv: list[str]) -> int:
    options = parse(argv)
    stop_on_sigterm()
    reason = netlab_unavailable()
    if reason is not None:
        print(f"the network lab cannot run here: {reason}", file=sys.stderr)
        return 2
    nemeses = options.nemesis or list(NEMESES)
    base = options.seed
    if base is None:
        base = int(os.environ.get("SR3_TEST_SEED") or random.SystemRandom().randrange(2**32))
    work = options.work or Path(tempfile.mkdtemp(prefix="sr3-faults-"))
    print(f"base seed {base}, scale {options.scale:g}, {options.seeds} run(s) each; work in {work}")
    started_s = time.monotonic()
    summary: dict[str, Any] = {}
    for nemesis in nemeses:
        if options.scenario_seed is not None:
            seeds = [options.scenario_seed]
        else:
            seeds = scenario_seeds(base, nemesis, options.seeds)
        reports, errors = run_nemesis(nemesis, seeds, options.scale, work)
        summary[nemesis] = summarize(reports, errors)
    report = {
        "generated": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": options.commit or commit_of(ROOT),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "base_seed": base,
        "seeds_per_nemesis": 1 if options.scenario_seed is not None else options.seeds,
        "scale": options.scale,
        "duration_s": round(time.monotonic() - started_s, 1),
        "nemeses": summary,
    }
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(report, indent=2) + "\n")
    found = sum(len(s["violations"]) + len(s["errors"]) for s in summary.values())
    for nemesis, figures in summary.items():
        print(
            f"{nemesis}: {figures['runs']} runs, {figures['operations']} calls, "
            f"{len(figures['violations'])} violations, {len(figures['errors'])} errors"
        )
    if options.work is None and not any(work.iterdir()):
        work.rmdir()
    print(f"report in {options.out}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
