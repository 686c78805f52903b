"""Tiles fitted to the machine: the tile sizes of an unmasked forward and backward, measured the first time they matter.

The best tile depends on the CPU: 512 x 512 was the fastest on the Intel Xeon these tiles
were first measured on, and on an AMD EPYC 256 x 256 ran up to 8% faster in one run and
6% slower in another (plain forward, N = 4096, 8 heads: two cores are noisy). So the
first time a process runs an unmasked pass of at least MIN_LENGTH queries and keys in a
shape class (pass, dtype, head size, batch x heads, with or without GQA), it times each of
that pass's candidates (the forward's square CANDIDATES, the backward's
BACKWARD_CANDIDATES rows x keys) on a short probe of that class (PROBE_LENGTH queries and
keys, the same batch x heads) and keeps the fastest, in memory, for the rest of the
process, when it beats the pass's default by MARGIN (else the default stays). The forward's
probe costs about 1 s, the backward's about 2 s (AMD EPYC, 8 heads, d 64). Explicit
block_q / block_k always win; shorter calls, masked calls and other devices keep the
defaults (a mask's tiles are chosen by their own cost model, ``flash.choose_blocks``).

    tile_choice(4096, 4096, heads=8)                  -> TileChoice(512, 512, "measured", "...", {(512, 512): ..., ...})
    tile_choice(4096, 4096, heads=8, backward=True)   -> TileChoice(128, 512, ...)

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
CANDIDATES = (128, 256, 512)  # the forward's square tiles
DEFAULT_TILE = 512
# The backward's (rows, keys) per tile: 128 rows by default (``flash.BACKWARD_BLOCK_Q``; its dK and dV
# sum 64 rows at a time whatever the tile), 512 keys. On the AMD EPYC here the four ran within 5%
# of each other at N = 2048 and 4096 (256 x 256 the fastest twice, 128 x 512 never).
BACKWARD_CANDIDATES = ((128, 512), (128, 256), (256, 256), (256, 512))
BACKWARD_DEFAULT = (128, 512)
MIN_LENGTH = 2048  # queries and keys: shorter calls keep the default (a probe would cost more than it saves)
PROBE_LENGTH = 2048  # a 1024-token probe chose 256 x 256 for GQA 8/2 where 4096 tokens ran 3% faster on 512 x 512
PROBE_ROUNDS = 2  # rounds in which every candidate is timed once, in turn, after one warm-up call each; the fastest counts
MARGIN = 0.05  # another tile replaces the default only when the probe runs it this much faster: 2-core timings are noisy
CACHE_VERSION = 2  # 2: a choice per pass, its tile a [rows, keys] pair


@dataclass(frozen=True)
class TileChoice:
    """The tiles an unmasked pass uses, and why.

    Attributes:
        block_q: query rows per tile.
        block_k: keys per tile.
        source: "given" (the caller's), "measured" (in this process), "cache file"
            (SELFATTN_TILE_CACHE) or "default".
        reason: one line saying why.
        timings: (block_q, block_k) -> the probe's seconds, when measured or read from the cache.
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


def shape_class(heads: int, d_head: int, dtype: torch.dtype, group: int, backward: bool = False) -> str:
    """The key a choice is kept under: the machine, the pass, the dtype, the head size, batch x heads and the GQA group."""
    return (f"{machine_key()}|{'backward' if backward else 'forward'}|{str(dtype).removeprefix('torch.')}"
            f"|d{d_head}|bh{heads}|g{group}")


def candidates(backward: bool = False) -> tuple[tuple[int, int], ...]:
    """The (block_q, block_k) pairs a pass's probe times, its default first (BACKWARD_DEFAULT, or DEFAULT_TILE square)."""
    pairs = BACKWARD_CANDIDATES if backward else tuple((size, size) for size in CANDIDATES)
    default = BACKWARD_DEFAULT if backward else (DEFAULT_TILE, DEFAULT_TILE)
    return (default, *(pair for pair in pairs if pair != default))


def tile_choice(q_len: int, kv_len: int, heads: int = 8, d_head: int = 64, dtype: torch.dtype = torch.float32,
                group: int = 1, block_q: int | None = None, block_k: int | None = None,
                backward: bool = False) -> TileChoice:
    """The tiles an unmasked CPU pass of this shape uses, measuring them the first time (see the module docstring).

    Args:
        q_len: queries.
        kv_len: keys.
        heads: batch x query heads of the call.
        d_head: the head size.
        dtype: the inputs' dtype.
        group: query heads per key/value head (GQA), 1 without.
        block_q: the caller's rows per tile, or None.
        block_k: the caller's keys per tile, or None.
        backward: the backward pass's tiles (rows, keys) instead of the forward's.

    Returns:
        A ``TileChoice``; given blocks are kept as given.
    """
    if block_q is not None and block_k is not None:
        return TileChoice(block_q, block_k, "given", "block_q and block_k were given")
    if q_len < MIN_LENGTH or kv_len < MIN_LENGTH:
        default = candidates(backward)[0]
        choice = TileChoice(*default, "default",
                            f"fewer than {MIN_LENGTH} queries or keys: the default tiles, nothing measured")
    else:
        choice = _choice(shape_class(heads, d_head, dtype, group, backward), heads, d_head, dtype, group, backward)
    return TileChoice(block_q or choice.block_q, block_k or choice.block_k, choice.source, choice.reason, choice.timings)


def _choice(key: str, heads: int, d_head: int, dtype: torch.dtype, group: int, backward: bool) -> TileChoice:
    with _lock:
        _read_file_once()
        found = _chosen.get(key)
        if found is not None:
            return found
        timings = _measure(heads, d_head, dtype, group, backward)
        default = candidates(backward)[0]
        best = min(timings, key=timings.get)
        shown = ", ".join(f"{q} x {k}: {seconds * 1e3:.1f} ms" for (q, k), seconds in timings.items())
        named = f"{default[0]} x {default[1]}"
        if timings[best] > (1 - MARGIN) * timings[default]:
            best, why = default, f"no tile ran {MARGIN:.0%} faster than the default {named}"
        else:
            why = f"the fastest, {1 - timings[best] / timings[default]:.0%} faster than {named}"
        pass_name = "backward" if backward else "forward"
        found = _chosen[key] = TileChoice(*best, "measured",
                                          f"{why} on a {PROBE_LENGTH}-token probe of this shape's {pass_name} ({shown})",
                                          timings)
        _write_file()
        return found


def _measure(heads: int, d_head: int, dtype: torch.dtype, group: int, backward: bool = False) -> dict:
    """Seconds of an unmasked pass on the probe, for each candidate tile (the fastest of a few runs)."""
    from selfattn.kernels.flash_backward import flash_backward  # the tile loops themselves, as flash_attention runs them
    from selfattn.kernels.flash_tiles import flash_forward

    generator = torch.Generator().manual_seed(0)
    n = PROBE_LENGTH
    q = torch.randn(1, heads, n, d_head, generator=generator).to(dtype)
    k, v = (torch.randn(1, heads // group, n, d_head, generator=generator).to(dtype) for _ in range(2))
    scale = d_head ** -0.5
    with torch.no_grad():
        if backward:  # the forward's output and lse (with its remainder, as a float32 backward gets it), made once
            grad_out = torch.randn(q.shape, generator=generator).to(dtype)
            output, lse, *low = flash_forward(q, k, v, None, scale, DEFAULT_TILE, DEFAULT_TILE, group,
                                              lse_low=dtype != torch.float64)
        runs = {}
        for rows, keys in candidates(backward):
            if backward:
                runs[(rows, keys)] = lambda r=rows, c=keys: flash_backward(grad_out, q, k, v, output, lse, None, scale,  # noqa: E731
                                                                           r, c, group, lse_low=low[0] if low else None)
            else:
                runs[(rows, keys)] = lambda r=rows, c=keys: flash_forward(q, k, v, None, scale, r, c, group)  # noqa: E731
            runs[(rows, keys)]()  # warm-up: the tile buffers of this size, torch's threads
        timings = dict.fromkeys(runs, float("inf"))
        for _ in range(PROBE_ROUNDS):  # the candidates take turns, so that a slow spell of the machine touches them all
            for tiles, run in runs.items():
                start = time.perf_counter()
                run()
                timings[tiles] = min(timings[tiles], time.perf_counter() - start)
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
            tile = tuple(entry["tile"])
            allowed = candidates("|backward|" in key)
            if tile not in allowed:
                raise ValueError(f"tile {entry['tile']!r} is not one of {[list(c) for c in allowed]}")
            timings = {_pair(name): float(t) for name, t in entry.get("timings", {}).items()}
            _chosen[key] = TileChoice(*tile, "cache file", f"read from {path} ({CACHE_ENV})", timings)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        print(f"selfattn: warning: ignoring the tile cache {path} ({CACHE_ENV}): {error}", file=sys.stderr)


def _pair(name: str) -> tuple[int, int]:
    """"128x512" -> (128, 512); anything else is a ValueError."""
    rows, keys = name.split("x")
    return int(rows), int(keys)


def _write_file() -> None:
    path = _cache_path()
    if path is None:
        return
    choices = {key: {"tile": [c.block_q, c.block_k], "timings": {f"{q}x{k}": t for (q, k), t in c.timings.items()}}
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
