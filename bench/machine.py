"""The machine a benchmark ran on, in one line: figures from two CPUs must never be mixed.

Ratios against PyTorch move with the CPU (an Intel with AMX and AVX-512 and an AMD EPYC
gave 1.08x and 1.31x for the same plain forward), so every benchmark prints this line
first and every page of figures quotes it:

    Intel(R) Xeon(R) Processor (family 6 model 207), 2 cores / 2 threads, L1d 48 KiB, L2 2 MiB,
    L3 300 MiB; AMX, AVX-512, AVX2; torch 2.13.0+cpu, 2 threads

Read from /proc/cpuinfo and /sys/devices/system/cpu (Linux); elsewhere, what ``platform``
knows.

    .venv/bin/python bench/machine.py
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

# cpuinfo flag -> the name the pages use, most telling first
FEATURES = (("amx_tile", "AMX"), ("avx512f", "AVX-512"), ("avx2", "AVX2"))
CACHE_LEVELS = (("1", "Data", "L1d"), ("2", "Unified", "L2"), ("3", "Unified", "L3"))


@dataclass(frozen=True)
class Machine:
    """A CPU as the benchmark pages name it."""

    model: str
    family: str = ""
    model_number: str = ""
    cores: int = 0
    threads: int = 0
    caches: dict[str, str] = field(default_factory=dict)  # "L1d" -> "48 KiB", ...
    features: tuple[str, ...] = ()

    def line(self, torch_threads: int | None = None, torch_version: str | None = None) -> str:
        """One line: model, cores, caches, vector features, and torch's threads when given."""
        parts = [self.model + (f" (family {self.family} model {self.model_number})" if self.family else "")]
        if self.cores:
            parts.append(f"{self.cores} cores / {self.threads} threads")
        parts += [f"{name} {size}" for name, size in self.caches.items()]
        text = ", ".join(parts) + "; " + (", ".join(self.features) if self.features else "no AVX2")
        if torch_version is not None:
            text += f"; torch {torch_version}, {torch_threads} threads"
        return text


def parse_cpuinfo(text: str) -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo text ("model name" -> ...); "processors" counts them."""
    fields: dict[str, str] = {}
    processors = 0
    for line in text.splitlines():
        name, _, value = line.partition(":")
        name, value = name.strip(), value.strip()
        if name == "processor":
            processors += 1
        elif name and processors == 1 and name not in fields:
            fields[name] = value
    fields["processors"] = str(processors)
    return fields


def read_caches(cpu: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> dict[str, str]:
    """L1d, L2 and L3 sizes of one core's view, from sysfs ("48K" -> "48 KiB")."""
    caches: dict[str, str] = {}
    for index in sorted(cpu.glob("index*")) if cpu.is_dir() else []:
        try:
            level, kind, size = ((index / name).read_text().strip() for name in ("level", "type", "size"))
        except OSError:
            continue
        for want_level, want_kind, label in CACHE_LEVELS:
            if level == want_level and kind == want_kind:
                caches[label] = readable_size(size)
    return dict(sorted(caches.items()))


def readable_size(size: str) -> str:
    """sysfs's "2048K" as "2 MiB", "48K" as "48 KiB"."""
    if size.endswith("K") and size[:-1].isdigit():
        kib = int(size[:-1])
        return f"{kib // 1024} MiB" if kib % 1024 == 0 else f"{kib} KiB"
    return size


def describe(cpuinfo: str | None = None, caches: dict[str, str] | None = None) -> Machine:
    """This machine (or the one the given /proc/cpuinfo text and caches describe)."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text() if path.exists() else ""
    fields = parse_cpuinfo(cpuinfo)
    if not fields.get("model name"):
        return Machine(platform.processor() or platform.machine() or "unknown CPU", threads=os.cpu_count() or 0)
    flags = set(fields.get("flags", "").split())
    threads = int(fields["processors"])
    siblings, cores = int(fields.get("siblings", threads) or threads), int(fields.get("cpu cores", threads) or threads)
    sockets = max(1, threads // max(1, siblings))
    return Machine(
        model=fields["model name"],
        family=fields.get("cpu family", ""),
        model_number=fields.get("model", ""),
        cores=cores * sockets,
        threads=threads,
        caches=read_caches() if caches is None else caches,
        features=tuple(name for flag, name in FEATURES if flag in flags),
    )


def machine_line() -> str:
    """This machine's line with torch's version and threads: the first line every benchmark prints."""
    import torch

    return describe().line(torch.get_num_threads(), torch.__version__)


if __name__ == "__main__":
    print(machine_line())
