"""Where the test suite spends its time: the 30 slowest tests and each file's total, from pytest's JUnit XML.

Runs the README's test command (``python -m pytest -n 2 -q``, more pytest arguments after ``--``) with a JUnit
report, or reads one a run already wrote (``--junit``), and writes one labelled section of
``reports/test_durations.md`` (the other sections are kept: a "before" and an "after" side by side). With
``--order`` it also rewrites ``tests/data/durations.json``: each test file's measured total, which
``tests/conftest.py`` reads to start the longest files first (the two xdist workers then end together), and each
test's time over a second (a test over conftest's SLOW_OVER is marked slow); ``--moved`` lists the cases that run
only with ``--full-matrix``.

Run: python benchmarks/test_durations.py --label after [--order] [-- --cov --cov-config=.ci/coveragerc]
     python benchmarks/test_durations.py --label before --junit junit.xml --wall 3300
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "reports" / "test_durations.md"
ORDER = ROOT / "tests" / "data" / "durations.json"
SLOWEST = 30
HEADER = """# Where the test suite spends its time

Written by `benchmarks/test_durations.py` from pytest's JUnit report (each test's setup, call and teardown). One
section per labelled run; `--label` replaces its own section and keeps the others. The machine is this project's
(2 cores, no GPU); wall is the whole pytest run, CPU figures add both workers.
"""


def cases(junit: Path) -> list[tuple[str, str, float, str]]:
    """(file, test name, seconds, outcome) of every test case in a JUnit report (a test in a class is named
    ``Class::test``, as in its node id)."""
    out = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "")
        # pytest names a test's class after its module: tests.test_x.TestY -> tests/test_x.py and TestY
        parts = module.split(".")
        classes = []
        while parts and not parts[-1].startswith("test_"):
            classes.insert(0, parts.pop())
        path = "/".join(parts) + ".py" if parts else module
        outcome = "skipped" if case.find("skipped") is not None else (
            "failed" if case.find("failure") is not None or case.find("error") is not None else "passed")
        out.append((path, "::".join([*classes, case.get("name", "")]), float(case.get("time", 0.0)), outcome))
    return out


def suite_seconds(junit: Path) -> float:
    return max(float(s.get("time", 0.0)) for s in ET.parse(junit).getroot().iter("testsuite"))


def section(label: str, rows: list[tuple[str, str, float, str]], wall: float, command: str) -> str:
    ran = [r for r in rows if r[3] != "skipped"]
    total = sum(r[2] for r in rows)
    per_file: dict[str, list[float]] = defaultdict(list)
    for path, _, secs, _ in rows:
        per_file[path].append(secs)
    over = {limit: sum(1 for r in rows if r[2] > limit) for limit in (10, 60, 180)}
    lines = [f"## {label}", "",
             f"{dt.date.today().isoformat()} · `{command}` · wall {wall:,.0f} s · {len(ran):,} tests ran "
             f"({len(rows) - len(ran):,} skipped) · {total:,.0f} s in tests (both workers) · over 10 s: {over[10]}, "
             f"over 60 s: {over[60]}, over 180 s: {over[180]}", "",
             f"The {SLOWEST} slowest tests:", "", "| seconds | test |", "|---:|---|"]
    for path, name, secs, _ in sorted(rows, key=lambda r: -r[2])[:SLOWEST]:
        lines.append(f"| {secs:,.1f} | `{path}::{name}` |")
    lines += ["", "Each file's total:", "", "| seconds | tests | file |", "|---:|---:|---|"]
    for path, times in sorted(per_file.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"| {sum(times):,.1f} | {len(times)} | `{path}` |")
    return "\n".join(lines) + "\n"


def write_section(label: str, text: str, report: Path = REPORT) -> None:
    """Replace the section headed ``## label`` (or add it), keeping the others in their order."""
    old = report.read_text(encoding="utf-8") if report.exists() else HEADER
    head, *rest = re.split(r"(?m)^(?=## )", old)
    sections = {re.match(r"## (.*)", s).group(1).strip(): s for s in rest}
    sections[label] = text
    report.write_text(head.rstrip() + "\n\n" + "\n".join(s.rstrip() + "\n" for s in sections.values()),
                      encoding="utf-8")


def write_order(rows: list[tuple[str, str, float, str]], path: Path = ORDER) -> None:
    """Each file's total (the order the workers take them in) and each test's time over a second (a test over
    tests/conftest.py's SLOW_OVER is marked slow at collection)."""
    per_file: dict[str, float] = defaultdict(float)
    for file, _, secs, _ in rows:
        per_file[Path(file).name] += secs
    tests = {f"{file}::{name}": round(secs, 1) for file, name, secs, _ in sorted(rows, key=lambda r: -r[2])
             if secs > 1.0}
    files = {k: round(v, 1) for k, v in sorted(per_file.items(), key=lambda kv: -kv[1])}
    path.write_text(json.dumps({"files": files, "tests": tests}, indent=1) + "\n", encoding="utf-8")


def moved_section() -> str:
    """The cases that left the default run for the full matrices (marked full_matrix), counted per test."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "--full-matrix", "-m",
                           "full_matrix", "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True)
    ids = [ln for ln in proc.stdout.splitlines() if "::" in ln]
    per_test: dict[str, int] = defaultdict(int)
    for node in ids:
        per_test[node.split("[", 1)[0]] += 1
    lines = ["## Moved to the full matrices", "",
             f"{len(ids)} cases run only with `python -m pytest -n 2 -q --full-matrix -m full_matrix` (their "
             "representatives, one per model family, lever, optimizer, workload and card class, stay in the default "
             "run; tests/matrix.py):", "", "| cases | test |", "|---:|---|"]
    lines += [f"| {n} | `{test}` |" for test, n in sorted(per_test.items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--label", required=True, help="the section's title, e.g. before or after")
    p.add_argument("--junit", type=Path, help="read this JUnit report instead of running the suite")
    p.add_argument("--wall", type=float, help="the run's wall seconds (default: the report's own suite time)")
    p.add_argument("--command", default=None, help="the command the report came from, as shown")
    p.add_argument("--order", action="store_true", help="also rewrite tests/data/durations.json")
    p.add_argument("--moved", action="store_true", help="also rewrite the list of cases moved to the full matrices")
    p.add_argument("--out", type=Path, default=REPORT)
    args = p.parse_args(argv)
    if args.junit is None:
        junit = Path(tempfile.mkdtemp()) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-n", "2", "-q", f"--junitxml={junit}", *extra]
        start = time.perf_counter()
        rc = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ)).returncode
        wall = time.perf_counter() - start
        if rc not in (0, 1) or not junit.exists():
            print(f"test_durations: pytest exited {rc} without a report", file=sys.stderr)
            return rc or 1
        command = args.command or " ".join(["python -m pytest -n 2 -q", *extra])
    else:
        junit, rc = args.junit, 0
        wall = args.wall if args.wall is not None else suite_seconds(junit)
        command = args.command or "python -m pytest -n 2 -q"
    rows = cases(junit)
    write_section(args.label, section(args.label, rows, wall, command), args.out)
    if args.order:
        write_order(rows)
    if args.moved:
        write_section("Moved to the full matrices", moved_section(), args.out)
    print(f"{args.out}: section {args.label!r}, {len(rows)} tests, wall {wall:,.0f} s")
    return rc


if __name__ == "__main__":
    sys.exit(main())
