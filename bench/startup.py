"""Start-up cost of the CLI against its peer, `python -c "import torch"`, in one run.

The commands are interleaved round by round, so a change in the machine's load hits
them alike; the report gives medians and the ratio of each command to importing torch.

    .venv/bin/python bench/startup.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import os
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import describe  # noqa: E402

COMMANDS = {
    'python -c "import torch"': [sys.executable, "-c", "import torch"],
    "selfattn explain": [sys.executable, "-m", "selfattn", "explain"],
    "selfattn explain --format json": [sys.executable, "-m", "selfattn", "explain", "--format", "json"],
    "selfattn --help": [sys.executable, "-m", "selfattn", "--help"],
}


def wall_time(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    rounds = parser.parse_args().rounds
    print(describe().line(), flush=True)  # no torch here: the commands import it themselves
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for i in range(rounds):
        for name, command in COMMANDS.items():
            times[name].append(wall_time(command))
        print(f"round {i + 1}/{rounds} done", file=sys.stderr, flush=True)
    peer = times['python -c "import torch"']
    print(f"{'command':32} {'median s':>9} {'min s':>7} {'median ratio':>13} {'min ratio':>10}")
    for name, values in times.items():
        median, fastest = statistics.median(values), min(values)
        median_ratio, min_ratio = median / statistics.median(peer), fastest / min(peer)
        print(f"{name:32} {median:9.3f} {fastest:7.3f} {median_ratio:12.2f}x {min_ratio:9.2f}x")


if __name__ == "__main__":
    main()
