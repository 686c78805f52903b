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
"""

from __future__ import annotations

import os
import queue
import threading

import torch

_pools: dict[int, "_Pool"] = {}
_lock = threading.Lock()
_local = threading.local()


class _Pool:
    """``threads`` daemon threads, all started at once, each running torch on one core."""

    def __init__(self, threads: int) -> None:
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
            run, unit, grad, results, index, done = self.tasks.get()
            try:
                with torch.set_grad_enabled(grad):  # autograd's mode is per thread: the caller's
                    results[index] = (True, run(unit))
            except BaseException as error:  # noqa: BLE001 - handed back to the caller, raised there
                results[index] = (False, error)
            done.release()

    def map(self, run, units: list) -> list:
        results: list = [None] * len(units)
        done = threading.Semaphore(0)
        grad = torch.is_grad_enabled()
        for index, unit in enumerate(units):
            self.tasks.put((run, unit, grad, results, index, done))
        for _ in units:
            done.acquire()
        for ok, value in results:
            if not ok:
                raise value
        return [value for _, value in results]


def _pool(threads: int) -> _Pool:
    with _lock:
        pool = _pools.get(threads)
        if pool is None:
            pool = _pools[threads] = _Pool(threads)
            # set_num_threads(1) in the workers also set the count that threads started later begin
            # with; give back the caller's, so that no other thread inherits 1.
            torch.set_num_threads(threads)
        return pool


def cores_are_shared() -> bool:
    """Whether another process is running now on a core torch's threads would use.

    Linux's /proc/loadavg counts the threads runnable now on the whole machine (its fourth
    field, "running/total"); /proc/self/task says which of them are ours (this thread, and
    torch's own while they spin waiting for work). Ours are counted before and after, and the
    larger count taken, so that one of ours going to sleep in between is not taken for
    another process. Others running, plus torch's threads, more than the cores: torch's threads
    would share a core. About 60 us a call. Where those files do not exist: False, and torch
    runs every call on all its threads.
    """
    try:
        before = _our_running()
        with open("/proc/loadavg", "rb") as file:
            running = int(file.read().split()[3].split(b"/")[0])
        ours = max(before, _our_running())
    except (OSError, ValueError, IndexError):
        return False
    return running - ours + torch.get_num_threads() > _cores()


def _our_running() -> int:
    count = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/stat", "rb") as file:
                count += file.read().rsplit(b")", 1)[1].split()[0] == b"R"
        except OSError:  # the thread ended meanwhile
            pass
    return count


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def in_worker() -> bool:
    return getattr(_local, "worker", False)


def run_units(units: list, run, sequential: bool = False) -> list:
    """``[run(unit) for unit in units]``, shared between torch's threads, each unit on one thread.

    Args:
        units: the work, largest first (a thread takes the next unit when it finishes one).
        run: unit -> result; units must write to disjoint memory.
        sequential: run them in this thread, in order (tile logging).

    Returns:
        The results in the units' order. An exception in a unit is raised here, after every
        unit has finished.
    """
    threads = torch.get_num_threads()
    if sequential or threads < 2 or len(units) < 2 or in_worker() or not cores_are_shared():
        return [run(unit) for unit in units]
    return _pool(threads).map(run, units)
