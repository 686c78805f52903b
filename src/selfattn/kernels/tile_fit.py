"""Tiles fitted to the machine: the tile size of an unmasked forward, measured the first time it matters.

The best tile depends on the CPU: 512 x 512 was the fastest on the Intel Xeon these tiles
were first measured on, and on an AMD EPYC 256 x 256 ran up to 8% faster in one run and
6% slower in another (plain forward, N = 4096, 8 heads: two cores are noisy). So the
first time a process runs an unmasked forward of at least MIN_LENGTH queries and keys in a
shape class (dtype, head size, batch x heads, with or without GQA), it times each of
CANDIDATES on a short probe of that class (PROBE_LENGTH queries and keys, the same
batch x heads) and keeps the fastest, in memory, for the rest of the process, when it
beats the default by MARGIN (else the default stays). Explicit
block_q / block_k always win; shorter calls, masked calls and other devices keep the
defaults (a mask's tiles are chosen by their own cost model, ``flash.choose_blocks``).

    tile_choice(4096, 4096, heads=8)   -> TileChoice(256, 256, "measured", "...", {128: ..., 256: ..., 512: ...})

A cache file keeps the choices between processes, only when asked for: set
SELFATTN_TILE_CACHE to a file's path. It is read once per process; a file that cannot be
read as this cache is ignored with one warning line, and rewritten with what is measured
next. The choice changes only how the work is cut: results differ from fixed tiles by
float32 reordering at most.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from functools import lru_cache

import torch

CACHE_ENV = "SELFATTN_TILE_CACHE"
CANDIDATES = (128, 256, 512)
DEFAULT_TILE = 512
MIN_LENGTH = 2048  # queries and keys: shorter calls keep the default (a probe would cost more than it saves)
PROBE_LENGTH = 2048  # a 1024-token probe chose 256 x 256 for GQA 8/2 where 4096 tokens ran 3% faster on 512 x 512
PROBE_ROUNDS = 2  # each candidate timed this many times after one warm-up call; the fastest time counts
MARGIN = 0.05  # another tile replaces the default only when the probe runs it this much faster: 2-core timings are noisy
CACHE_VERSION = 1


@dataclass(frozen=True)
class TileChoice:
    """The tiles an unmasked forward uses, and why.

    Attributes:
        block_q: query rows per tile.
        block_k: keys per tile.
        source: "given" (the caller's), "measured" (in this process), "cache file"
            (SELFATTN_TILE_CACHE) or "default".
        reason: one line saying why.
        timings: tile size -> the probe's seconds, when measured or read from the cache.
    """

    block_q: int
    block_k: int
    source: str
    reason: str
    timings: dict = field(default_factory=dict)


_lock = threading.Lock()
_chosen: dict[str, TileChoice] = {}
_file_read = False


@lru_cache(maxsize=1)
def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo; elsewhere what ``platform`` knows)."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_key() -> str:
    """The CPU, torch's version and its threads: a cache file may move between machines."""
    return f"{cpu_name()}|torch {torch.__version__}|{torch.get_num_threads()} threads"


def shape_class(heads: int, d_head: int, dtype: torch.dtype, group: int) -> str:
    """The key a choice is kept under: the machine, the dtype, the head size, batch x heads and the GQA group."""
    return f"{machine_key()}|{str(dtype).removeprefix('torch.')}|d{d_head}|bh{heads}|g{group}"


def tile_choice(q_len: int, kv_len: int, heads: int = 8, d_head: int = 64, dtype: torch.dtype = torch.float32,
                group: int = 1, block_q: int | None = None, block_k: int | None = None) -> TileChoice:
    """The tiles an unmasked CPU forward of this shape uses, measuring them the first time (see the module docstring).

    Args:
        q_len: queries.
        kv_len: keys.
        heads: batch x query heads of the call.
        d_head: the head size.
        dtype: the inputs' dtype.
        group: query heads per key/value head (GQA), 1 without.
        block_q: the caller's rows per tile, or None.
        block_k: the caller's keys per tile, or None.

    Returns:
        A ``TileChoice``; given blocks are kept as given.
    """
    if block_q is not None and block_k is not None:
        return TileChoice(block_q, block_k, "given", "block_q and block_k were given")
    if q_len < MIN_LENGTH or kv_len < MIN_LENGTH:
        choice = TileChoice(DEFAULT_TILE, DEFAULT_TILE, "default",
                            f"fewer than {MIN_LENGTH} queries or keys: the default tiles, nothing measured")
    else:
        choice = _choice(shape_class(heads, d_head, dtype, group), heads, d_head, dtype, group)
    return TileChoice(block_q or choice.block_q, block_k or choice.block_k, choice.source, choice.reason, choice.timings)


def _choice(key: str, heads: int, d_head: int, dtype: torch.dtype, group: int) -> TileChoice:
    with _lock:
        _read_file_once()
        found = _chosen.get(key)
        if found is not None:
            return found
        timings = _measure(heads, d_head, dtype, group)
        best = min(timings, key=timings.get)
        shown = ", ".join(f"{size}: {seconds * 1e3:.1f} ms" for size, seconds in sorted(timings.items()))
        if timings[best] > (1 - MARGIN) * timings[DEFAULT_TILE]:
            best, why = DEFAULT_TILE, f"no tile ran {MARGIN:.0%} faster than the default {DEFAULT_TILE}"
        else:
            why = f"the fastest, {1 - timings[best] / timings[DEFAULT_TILE]:.0%} faster than {DEFAULT_TILE}"
        found = _chosen[key] = TileChoice(best, best, "measured",
                                          f"{why} on a {PROBE_LENGTH}-token probe of this shape ({shown})", timings)
        _write_file()
        return found


def _measure(heads: int, d_head: int, dtype: torch.dtype, group: int) -> dict[int, float]:
    """Seconds of an unmasked forward on the probe, for each candidate tile (the fastest of a few runs)."""
    from selfattn.kernels.flash_tiles import flash_forward  # the tile loop itself, as flash_attention runs it

    generator = torch.Generator().manual_seed(0)
    n = PROBE_LENGTH
    q = torch.randn(1, heads, n, d_head, generator=generator).to(dtype)
    k, v = (torch.randn(1, heads // group, n, d_head, generator=generator).to(dtype) for _ in range(2))
    scale = d_head ** -0.5
    timings = {}
    with torch.no_grad():
        for size in CANDIDATES:
            run = lambda size=size: flash_forward(q, k, v, None, scale, size, size, group)  # noqa: E731
            run()
            best = float("inf")
            for _ in range(PROBE_ROUNDS):
                start = time.perf_counter()
                run()
                best = min(best, time.perf_counter() - start)
            timings[size] = best
    return timings


def _cache_path() -> str | None:
    return os.environ.get(CACHE_ENV) or None


def _read_file_once() -> None:
    global _file_read
    if _file_read:
        return
    _file_read = True
    path = _cache_path()
    if path is None or not os.path.exists(path):
        return
    try:
        with open(path, encoding="utf-8") as file:
            data = json.load(file)
        if data.get("version") != CACHE_VERSION or not isinstance(data.get("choices"), dict):
            raise ValueError("not a selfattn tile cache of this version")
        for key, entry in data["choices"].items():
            size = entry["tile"]
            if size not in CANDIDATES:
                raise ValueError(f"tile {size!r} is not one of {CANDIDATES}")
            timings = {int(s): float(t) for s, t in entry.get("timings", {}).items()}
            _chosen[key] = TileChoice(size, size, "cache file", f"read from {path} ({CACHE_ENV})", timings)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        print(f"selfattn: warning: ignoring the tile cache {path} ({CACHE_ENV}): {error}", file=sys.stderr)


def _write_file() -> None:
    path = _cache_path()
    if path is None:
        return
    choices = {key: {"tile": c.block_q, "timings": {str(s): t for s, t in c.timings.items()}}
               for key, c in _chosen.items()}
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as file:
            json.dump({"version": CACHE_VERSION, "choices": choices}, file, indent=1)
        os.replace(tmp, path)
    except OSError as error:
        print(f"selfattn: warning: cannot write the tile cache {path} ({CACHE_ENV}): {error}", file=sys.stderr)


def forget() -> None:
    """Drop every choice kept in memory and read the cache file again on next use (for tests)."""
    global _file_read
    with _lock:
        _chosen.clear()
        _file_read = False
