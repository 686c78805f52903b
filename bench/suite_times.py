"""Where the test suite's time goes: the per-file sums of a pytest junit report, and the slowest tests.

pytest writes the report with ``--junitxml``; each test's time there is its setup, call and
teardown. Run the suite serially (``-p no:xdist``) for per-file figures that add up to the
wall time; under pytest-xdist each file's sum is its time on one worker, beside the other.

    .venv/bin/python -m pytest -q -p no:xdist --junitxml=/tmp/serial.xml
    .venv/bin/python bench/suite_times.py /tmp/serial.xml                    # top 15 files, 15 tests
    .venv/bin/python bench/suite_times.py /tmp/before.xml /tmp/after.xml    # two reports side by side
    options: --top N (default 15)  --markdown (a table for docs/testing.md)
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ElementTree
from collections import defaultdict

from machine import describe  # bench/machine.py: the CPU the figures came from


def read_report(path: str) -> tuple[dict[str, float], dict[str, int], list[tuple[float, str]]]:
    """(seconds per test file, tests per file, (seconds, test id) of every test) from a junit report."""
    per_file: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    tests = []
    for case in ElementTree.parse(path).iter("testcase"):
        name = case.get("classname", "?").split(".")[-1] + ".py"
        seconds = float(case.get("time", 0.0))
        per_file[name] += seconds
        counts[name] += 1
        tests.append((seconds, f"{name}::{case.get('name')}"))
    return dict(per_file), dict(counts), tests


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", metavar="JUNIT.xml", help="one report, or two: before and after")
    parser.add_argument("--top", type=int, default=15, metavar="N")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    if len(args.reports) > 2 or args.top < 1:
        parser.error("give one or two reports, and --top of 1 or more")
    reports = [read_report(path) for path in args.reports]
    first = reports[0][0]
    files = sorted(first, key=first.get, reverse=True)[: args.top]
    columns = ["before s", "after s"] if len(reports) == 2 else ["seconds"]
    print(f"{describe().line()}; {len(reports[0][2])} tests in the first report")
    if args.markdown:
        print(f"| test file | tests | {' | '.join(columns)} |")
        print("|---|---:|" + "---:|" * len(columns))
    for name in files:
        times = [f"{report[0].get(name, 0.0):.1f}" for report in reports]
        if args.markdown:
            print(f"| {name} | {reports[-1][1].get(name, 0)} | {' | '.join(times)} |")
        else:
            print(f"{name:36} {reports[-1][1].get(name, 0):5d}  {'  '.join(f'{t:>8}' for t in times)}")
    totals = [f"{sum(report[0].values()):.0f}" for report in reports]
    if args.markdown:
        print(f"| all files | {len(reports[-1][2])} | {' | '.join(totals)} |")
    else:
        print(f"{'all files':36} {len(reports[-1][2]):5d}  {'  '.join(f'{t:>8}' for t in totals)}")
    print(f"slowest tests ({args.reports[-1]}):")
    for seconds, test in sorted(reports[-1][2], reverse=True)[: args.top]:
        print(f"  {seconds:6.1f}  {test}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
