"""Start P ranks of ``distributed_worker.py`` on this machine and collect what each reports.

Each rank is a separate Python process on a gloo process group over 127.0.0.1. Output
goes to files (a full pipe would block a rank), and the whole launch has a wall-clock
limit: past it every rank is killed and the calling test fails saying which ranks hung,
so a deadlock in the code under test can never hang pytest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from selfattn.distributed.demo import free_port  # the demo picks its port the same way

TESTS = Path(__file__).resolve().parent
WORKER = TESTS / "distributed_worker.py"
SRC = TESTS.parent / "src"


@dataclass
class RankRun:
    """One rank's process: exit status, output, the JSON records it printed, seconds until it exited."""

    rank: int
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    records: list[dict] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[dict]:
        return [r for r in self.records if r.get("kind") == kind]

    def error(self) -> dict | None:
        """The error record printed when a scenario raised, or None."""
        found = self.of_kind("error")
        return found[-1] if found else None

    def cases(self) -> dict[str, dict]:
        return {r["case"]: r for r in self.of_kind("case")}


@dataclass
class Launch:
    scenario: str
    ranks: list[RankRun]
    seconds: float

    def describe(self) -> str:
        """Every rank's exit status and the end of its stderr, for assertion messages."""
        return "\n".join(
            f"--- rank {r.rank}: exit {r.returncode} after {r.seconds:.1f} s; stderr tail:\n{r.stderr[-1500:]}"
            for r in self.ranks
        )


def launch(scenario: str, world_size: int, *args: str, limit: float = 90.0, pg_timeout: float = 60.0) -> Launch:
    """Run ``scenario`` on ``world_size`` ranks; fail the test if they are not all done within ``limit`` s."""
    for attempt in range(2):
        result = _launch_once(scenario, world_size, args, limit, pg_timeout)
        port_taken = any("address already in use" in r.stderr.lower() for r in result.ranks)
        if not port_taken:  # the free port can be taken by someone else before rank 0 binds it: retry once
            break
    return result


def _launch_once(scenario, world_size, args, limit, pg_timeout) -> Launch:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="ring-test-") as tmp:
        procs, files = [], []
        start = time.monotonic()
        for rank in range(world_size):
            env = dict(
                os.environ,
                RANK=str(rank),
                WORLD_SIZE=str(world_size),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                OMP_NUM_THREADS="1",
                PYTHONPATH=os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])),
            )
            out, err = (open(Path(tmp, f"rank{rank}.{name}"), "w+") for name in ("out", "err"))
            files.append((out, err))
            cmd = [sys.executable, str(WORKER), scenario, "--pg-timeout", str(pg_timeout), "--done-dir", tmp, *args]
            procs.append(subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env))
        ended: dict[int, float] = {}
        while len(ended) < world_size and time.monotonic() - start < limit:
            for rank, proc in enumerate(procs):
                if rank not in ended and proc.poll() is not None:
                    ended[rank] = time.monotonic() - start
            time.sleep(0.02)
        hung = [rank for rank in range(world_size) if rank not in ended]
        for rank in hung:
            procs[rank].kill()
            procs[rank].wait()
        ranks = []
        for rank, (proc, (out, err)) in enumerate(zip(procs, files)):
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read(), err.read()
            out.close()
            err.close()
            records = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
            ranks.append(RankRun(rank, proc.returncode, stdout, stderr, ended.get(rank, limit), records))
    result = Launch(scenario, ranks, time.monotonic() - start)
    if hung:
        pytest.fail(
            f"distributed scenario {scenario!r} on {world_size} ranks hung: ranks {hung} were still running "
            f"after {limit:.0f} s and were killed\n{result.describe()}",
            pytrace=False,
        )
    return result
