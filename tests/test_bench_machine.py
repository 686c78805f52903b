"""bench/machine.py names the CPU the figures came from: read from /proc/cpuinfo text and sysfs cache folders made up here."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from machine import describe, read_caches, readable_size  # noqa: E402


def cpuinfo(model: str, flags: str, processors: int = 2, cores: int = 2, family: str = "6", number: str = "207") -> str:
    block = (f"vendor_id\t: x\ncpu family\t: {family}\nmodel\t\t: {number}\nmodel name\t: {model}\n"
             f"siblings\t: {processors}\ncpu cores\t: {cores}\nflags\t\t: {flags}\n")
    return "\n".join(f"processor\t: {i}\n{block}" for i in range(processors))


def test_an_intel_with_amx_and_avx512():
    machine = describe(cpuinfo("Intel(R) Xeon(R) Processor", "fpu avx2 avx512f amx_tile amx_bf16"), {"L2": "2 MiB"})
    assert machine.features == ("AMX", "AVX-512", "AVX2") and (machine.cores, machine.threads) == (2, 2)
    line = machine.line(2, "2.13.0+cpu")
    assert line == ("Intel(R) Xeon(R) Processor (family 6 model 207), 2 cores / 2 threads, L2 2 MiB; AMX, AVX-512, "
                    "AVX2; torch 2.13.0+cpu, 2 threads")


def test_an_amd_with_smt_and_no_amx():
    text = cpuinfo("AMD EPYC 9B14 96-Core Processor", "fpu avx2 avx512f", processors=4, cores=2, family="25", number="17")
    machine = describe(text, {})
    assert machine.features == ("AVX-512", "AVX2") and (machine.cores, machine.threads) == (2, 4)
    assert machine.line().startswith("AMD EPYC 9B14 96-Core Processor (family 25 model 17), 2 cores / 4 threads; AVX-512")


def test_cache_sizes_from_sysfs(tmp_path):
    for index, (level, kind, size) in enumerate([("1", "Data", "48K"), ("1", "Instruction", "32K"), ("2", "Unified", "2048K"),
                                                 ("3", "Unified", "307200K")]):
        folder = tmp_path / f"index{index}"
        folder.mkdir()
        for name, value in (("level", level), ("type", kind), ("size", size)):
            (folder / name).write_text(value + "\n")
    assert read_caches(tmp_path) == {"L1d": "48 KiB", "L2": "2 MiB", "L3": "300 MiB"}
    assert readable_size("1536K") == "1536 KiB" and read_caches(tmp_path / "absent") == {}


def test_suite_times_sums_each_files_tests_from_a_junit_report(tmp_path, capsys, monkeypatch):
    """bench/suite_times.py: per-file sums and the slowest tests, from a report written here."""
    import suite_times

    report = tmp_path / "junit.xml"
    report.write_text('<testsuites><testsuite>'
                      '<testcase classname="tests.test_a" name="one" time="1.5"/>'
                      '<testcase classname="tests.test_a" name="two" time="2.0"/>'
                      '<testcase classname="tests.test_b" name="three" time="4.25"/>'
                      '</testsuite></testsuites>')
    per_file, counts, tests = suite_times.read_report(str(report))
    assert per_file == {"test_a.py": 3.5, "test_b.py": 4.25} and counts == {"test_a.py": 2, "test_b.py": 1}
    assert max(tests) == (4.25, "test_b.py::three")
    monkeypatch.setattr(sys, "argv", ["suite_times.py", str(report), str(report), "--markdown", "--top", "1"])
    assert suite_times.main() == 0
    out = capsys.readouterr().out
    assert "| test_b.py | 1 | 4.2 | 4.2 |" in out and "test_a.py" not in out.split("all files")[0]
    assert "| all files | 3 | 8 | 8 |" in out  # 7.75 s, rounded
