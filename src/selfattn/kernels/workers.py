"""The tile loops' work shared between threads that each run torch on one core.

torch runs each call on all its threads and waits at the end for the slowest. The tile
loops make thousands of calls of a few milliseconds; when another process takes a core,
the thread that shares it is half as fast and every call waits for it, while the other
thread spins: measured on 2 cores with one busy-loop process, flash attention ran 2-3x
slower while SDPA (one long call, which the scheduler can rebalance) ran 1.5x slower.

Here the loops hand out whole units (a row block in the forward, a key block in the
backward), largest first, to one Python thread per torch thread; each of those threads
runs torch on one core (``torch.set_num_threads(1)`` is per thread under OpenMP), and a
thread that finds its core shared simply takes fewer units. torch's calls release the GIL,
so the threads run at once; the Python between calls is a few microseconds per tile.

This happens only while the cores are contended (``cores_are_shared``): on a quiet machine
the one-core threads made the backward 6-10% slower than torch's own threading (each
core then works through whole tiles of every head, twice the data per core), so there
the loops run as before, in the calling thread.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time

import torch

_pools: dict[int, "_Pool"] = {}
_lock = threading.Lock()
_local = threading.local()


class _Pool:
    """``threads`` daemon threads, all started at once, each running torch on one core."""

    def __init__(self, threads: int) -> None:
        self.process = os.getpid()  # a forked child has none of these threads: it makes its own pool
        self.tasks: queue.SimpleQueue = queue.SimpleQueue()
        ready = threading.Barrier(threads + 1)
        for number in range(threads):
            threading.Thread(target=self._work, args=(ready,), name=f"selfattn-tiles-{number}", daemon=True).start()
        ready.wait()

    def _work(self, ready: threading.Barrier) -> None:
        _local.worker = True
        torch.set_num_threads(1)  # this thread's torch calls run on one core (OpenMP's setting is per thread)
        ready.wait()
        while True:
            run, unit, modes, results, index, done = self.tasks.get()
            grad, inference, autocast = modes
            try:
                # Inference mode, autocast and autograd's mode are per thread: the caller's. (Grad mode last:
                # inference_mode(False) would turn it on.)
                with contextlib.ExitStack() as stack:
                    if inference:
                        stack.enter_context(torch.inference_mode())
                    if autocast is not None:
                        stack.enter_context(torch.autocast("cpu", dtype=autocast))
                    stack.enter_context(torch.set_grad_enabled(grad))
                    results[index] = (True, run(unit))
            except BaseException as error:  # noqa: BLE001 - handed back to the caller, raised there
                results[index] = (False, error)
            done.release()

    def map(self, run, units: list) -> list:
        results: list = [None] * len(units)
        done = threading.Semaphore(0)
        autocast = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
        modes = (torch.is_grad_enabled(), torch.is_inference_mode_enabled(), autocast)
        for index, unit in enumerate(units):
            self.tasks.put((run, unit, modes, results, index, done))
        for _ in units:
            done.acquire()
        for ok, value in results:
            if not ok:
                raise value
        return [value for _, value in results]


def _pool(threads: int) -> _Pool:
    with _lock:
        pool = _pools.get(threads)
        if pool is None or pool.process != os.getpid():
            pool = _pools[threads] = _Pool(threads)
            # set_num_threads(1) in the workers also set the count that threads started later begin
            # with; give back the caller's, so that no other thread inherits 1.
            torch.set_num_threads(threads)
        return pool


# The last long run of units: did this process get less CPU time than its threads' wall time?
_contended = False
MIN_WALL_S = 0.02  # runs shorter than this are not measured: too little time to tell
SLACK = 0.25  # cores: a quiet machine gives torch's threads within 0.05 of their count (measured), a shared core 0.7 fewer


def cores_are_shared() -> bool:
    """Whether the last long run of tile loops got less CPU time than its threads could have.

    Measured, not guessed from the load: after each run of at least MIN_WALL_S, the process's
    CPU time (every thread's, torch's spinning included) over the wall time. On a quiet machine
    torch's threads, or ours, keep their cores: 1.96-2.0 cores on 2 threads here; with one core
    taken by a busy-loop process, 1.0 (torch's threads) and 1.2-1.3 (ours). Below threads - SLACK
    the next run shares its units out; a run that gets its cores back turns it off again. The
    process's first long run is not counted: starting torch's threads and touching fresh
    memory made it look contended on a quiet machine.
    """
    return _contended


_warm = False  # the process's first long run starts torch's threads and touches fresh memory: not a measure


def _measured(threads: int, wall: float, cpu: float) -> None:
    global _contended, _warm
    if wall >= MIN_WALL_S:
        if _warm:
            _contended = cpu / wall < threads - SLACK
        _warm = True


def in_worker() -> bool:
    return getattr(_local, "worker", False)


def run_units(units: list, run, cost=None, sequential: bool = False) -> list:
    """``[run(unit) for unit in units]``; while another process holds a core, shared between one-core threads.

    Args:
        units: the work, in the order a single thread should run it.
        run: unit -> result; units must write to disjoint memory.
        cost: unit -> a number: shared out, the costliest units go first, so that the threads
            finish together. None: in the given order.
        sequential: run them in this thread, in order, whatever the machine's load (tile
            logging, shared state).

    Returns:
        The results in the units' order. An exception in a unit is raised here, after every
        unit has finished.
    """
    threads = torch.get_num_threads()
    if sequential or threads < 2 or len(units) < 2 or in_worker():
        return [run(unit) for unit in units]
    wall, cpu = time.perf_counter(), time.process_time()
    if not cores_are_shared():
        results = [run(unit) for unit in units]
    else:
        order = sorted(range(len(units)), key=lambda i: -cost(units[i])) if cost else list(range(len(units)))
        results = [None] * len(units)
        for i, result in zip(order, _pool(threads).map(run, [units[i] for i in order])):
            results[i] = result
    _measured(threads, time.perf_counter() - wall, time.process_time() - cpu)
    return results
