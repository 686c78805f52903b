"""Start P ranks of ``distributed_worker.py`` on this machine and collect what each reports.

Each rank is a separate Python process on a gloo process group over 127.0.0.1. Output
goes to files (a full pipe would block a rank), and the whole launch has a wall-clock
limit: past it every rank is killed and the calling test fails saying which ranks hung,
so a deadlock in the code under test can never hang pytest.

The ranks are forked from a server process that has imported torch and the worker once
(multiprocessing's "forkserver"): a fresh Python per rank spent about 2 s of CPU importing
torch before doing anything, and a test session launches some twenty ranks. The server
runs no torch operation before it forks, so each rank starts as a fresh process would, with
its own environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, OMP_NUM_THREADS),
arguments and output files, and exits with the worker's status.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from selfattn.distributed.demo import free_port  # the demo picks its port the same way

TESTS = Path(__file__).resolve().parent
WORKER = TESTS / "distributed_worker.py"
SRC = TESTS.parent / "src"
# What the server imports once, before it forks the first rank: torch and the worker's own modules.
PRELOAD = ["torch", "torch.distributed", "torch.nn.functional", "selfattn.distributed", "distributed_worker",
           "distributed_harness"]
_context = None


def _forkserver():
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def _run_rank(argv: list[str], env: dict, out_path: str, err_path: str) -> None:
    """One rank, in the forked process: the worker's main with its own environment, arguments and output."""
    os.environ.clear()
    os.environ.update(env)
    out, err = open(out_path, "w", buffering=1), open(err_path, "w", buffering=1)  # by line: a rank may os._exit
    os.dup2(out.fileno(), 1)  # gloo and torch write to the file descriptors too
    os.dup2(err.fileno(), 2)
    sys.stdout, sys.stderr = out, err
    sys.argv = [str(WORKER), *argv]
    import distributed_worker

    status = 0
    try:
        distributed_worker.main()
    except SystemExit as stop:
        status = stop.code if isinstance(stop.code, int) else 1
    except BaseException:  # noqa: BLE001 - a rank's crash is reported as a Python process would
        traceback.print_exc()
        status = 1
    out.flush()
    err.flush()
    os._exit(status)  # no atexit handlers of the server's modules


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
            paths = (str(Path(tmp, f"rank{rank}.out")), str(Path(tmp, f"rank{rank}.err")))
            files.append(paths)
            argv = [scenario, "--pg-timeout", str(pg_timeout), "--done-dir", tmp, *args]
            proc = _forkserver().Process(target=_run_rank, args=(argv, env, *paths), daemon=True)
            proc.start()
            procs.append(proc)
        ended: dict[int, float] = {}
        while len(ended) < world_size and time.monotonic() - start < limit:
            for rank, proc in enumerate(procs):
                if rank not in ended and proc.exitcode is not None:
                    ended[rank] = time.monotonic() - start
            time.sleep(0.02)
        hung = [rank for rank in range(world_size) if rank not in ended]
        for rank in hung:
            procs[rank].kill()
            procs[rank].join()
        ranks = []
        for rank, (proc, (out_path, err_path)) in enumerate(zip(procs, files)):
            proc.join()
            stdout, stderr = (Path(path).read_text() if Path(path).is_file() else "" for path in (out_path, err_path))
            records = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
            ranks.append(RankRun(rank, proc.exitcode, stdout, stderr, ended.get(rank, limit), records))
    result = Launch(scenario, ranks, time.monotonic() - start)
    if hung:
        pytest.fail(
            f"distributed scenario {scenario!r} on {world_size} ranks hung: ranks {hung} were still running "
            f"after {limit:.0f} s and were killed\n{result.describe()}",
            pytrace=False,
        )
    return result
