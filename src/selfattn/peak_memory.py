"""The peak memory of a block of code, above what this process held when the block started.

    with PeakMemory(device) as peak:
        out = attention(q, k, v)
        out.backward(grad_out)
    peak.bytes   # int, or None where this machine cannot tell

How it is measured:

- CUDA: the caching allocator's own counters. ``reset_peak_memory_stats`` at the start,
  then ``max_memory_allocated - memory_allocated(at the start)``: tensors only, not the
  allocator's cached blocks or the CUDA context.
- CPU on Linux: the resident set. Writing "5" to /proc/self/clear_refs resets the kernel's
  high-water mark (VmHWM) to the current resident size, so VmHWM at the end minus VmRSS at
  the start is the block's peak growth. It counts every allocation of the whole process
  (other threads, communication buffers, Python objects), and freed memory that malloc
  kept and the block reuses does not count again; torch's CPU allocator has no peak
  counter of its own.
- Anything else (another OS, a container that forbids clear_refs, MPS): ``bytes`` stays
  None and ``unavailable`` says why.

Two things before the block can hide the block's own memory, so entering it first calls
``release_freed_memory()``:

- garbage still waiting for the cycle collector (tensors held by reference cycles, such as
  a kept traceback) is resident at the start; if the collector ran inside the block, the
  block could grow by as much as was freed without the peak rising above the start;
- memory freed before the block but kept by malloc (glibc keeps freed chunks below its
  mmap threshold, tens of MB once large tensors have come and gone) is resident already,
  so the block could reuse it unseen (CPU only). ``malloc_trim`` hands it back to the OS.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc

import torch

STATUS = "/proc/self/status"
CLEAR_REFS = "/proc/self/clear_refs"


class PeakMemory:
    """Context manager: ``bytes`` is the block's peak memory above its start, or None."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.bytes: int | None = None
        self.method: str | None = None  # what was measured, in words
        self.unavailable: str | None = None  # why nothing was, when bytes is None
        self._start = 0
        self.trimmed = False  # CPU: whether malloc's freed memory went back to the OS at the start

    def __enter__(self) -> "PeakMemory":
        # Garbage collected inside the block would offset the block's own growth, on any device.
        self.trimmed = release_freed_memory()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # queued kernels belong to the code before the block
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
            self.method = "CUDA allocator, tensors only (max_memory_allocated)"
        elif self.device.type == "cpu":
            try:
                with open(CLEAR_REFS, "w") as f:
                    f.write("5")  # VmHWM <- VmRSS
                self._start = status_kb("VmRSS") * 1024
                self.method = "resident memory of the process (Linux VmHWM)" + (
                    ", garbage collected and freed memory returned to the OS (malloc_trim) first"
                    if self.trimmed else ", garbage collected first")
            except (OSError, ValueError) as error:
                self.unavailable = f"no resettable peak resident memory here ({error})"
        else:
            self.unavailable = f"no peak-memory counter for device type {self.device.type!r}"
        return self

    def __exit__(self, *exc_info) -> None:
        if self.method is None:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.bytes = torch.cuda.max_memory_allocated(self.device) - self._start
        else:
            self.bytes = status_kb("VmHWM") * 1024 - self._start

    @property
    def megabytes(self) -> float | None:
        """``bytes`` in MB (2**20), or None."""
        return None if self.bytes is None else self.bytes / 2**20


def status_kb(field: str) -> int:
    """A "kB" field of /proc/self/status, e.g. VmRSS (resident now) or VmHWM (resident peak)."""
    with open(STATUS) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise ValueError(f"{field} is not in {STATUS}")


def release_freed_memory() -> bool:
    """Collect garbage and return malloc's free memory to the OS (glibc ``malloc_trim``). False where not possible."""
    gc.collect()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # no C library by that name, or not glibc (musl, macOS)
        return False
    return True
