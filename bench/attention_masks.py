"""The masks PyTorch's SDPA cannot skip: flash attention with structured masks against SDPA, in one run.

Run through ``bench/attention.py --masks``. Cases (batch 1, 8 heads, head dim 64, fp32,
N = 4096 unless said): a sliding window of 256 keys around every query (128 on each side,
Longformer's convention for a window of 256), the same with 256 on each side, a causal
sliding window of 256 keys (the query and the 255 before it, Mistral's convention), causal, 8 packed documents of 512
(block diagonal), GQA with 8 query heads sharing 2 key/value heads, no mask, and a peaked
softmax without a mask (queries 16 times larger: logits spread over ~160, as in trained
models, where most probabilities underflow float32; see ``kernels.online_softmax.exp_flush_tiny_``). SDPA gets
the equivalent dense bool mask (GQA: ``enable_gqa=True``); flash gets the structured mask.
Forward without autograd, and forward + backward; implementations interleaved round by
round; median times and their ratio (SDPA / flash: how many times faster flash is).

Then one long case: the sliding window of 256 (128 each side) at N = 65536, forward + backward through
flash alone, in a fresh process, with its peak memory above the inputs (a dense mask
alone would be 4.3 GB; the score matrix 137 GB).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from selfattn import flash_attention
from selfattn.masks import CausalMask, DocumentMask, SlidingWindowMask

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from peers import sdpa_shape  # noqa: E402  (bench/: SDPA's fast mask shape)
from selfattn.peak_memory import PeakMemory

N, HEADS, D_HEAD, LONG_N = 4096, 8, 64, 65536


def mask_cases(n: int = N):
    """(name, structured mask or None, kv heads, factor on the queries)."""
    return [
        ("sliding window 256 (128 each side)", SlidingWindowMask(n, left=128, right=128), HEADS, 1.0),
        ("sliding window 2 x 256 (256 each side)", SlidingWindowMask(n, left=256, right=256), HEADS, 1.0),
        ("causal sliding window 256", SlidingWindowMask(n, left=255, right=0), HEADS, 1.0),
        ("causal (for scale)", CausalMask(n), HEADS, 1.0),
        ("8 packed documents of 512", DocumentMask([n // 8] * 8), HEADS, 1.0),
        ("GQA 8 query / 2 kv heads", None, 2, 1.0),
        ("peaked softmax (queries x 16), no mask", None, HEADS, 16.0),
    ]


def inputs(n: int, kv_heads: int, requires_grad: bool, q_factor: float = 1.0):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, HEADS, n, D_HEAD, generator=g) * q_factor
    k, v = (torch.randn(1, kv_heads, n, D_HEAD, generator=g) for _ in range(2))
    grad_out = torch.randn(1, HEADS, n, D_HEAD, generator=g)
    return [t.requires_grad_(requires_grad) for t in (q, k, v)], grad_out


def run(fn, qkv, grad_out, backward: bool):
    for t in qkv:
        t.grad = None
    start = time.perf_counter()
    out = fn(*qkv)
    if backward:
        out.backward(grad_out)
    return time.perf_counter() - start, [out.detach()] + ([t.grad for t in qkv] if backward else [])


def time_masks(rounds: int, n: int = N, log=print) -> list[dict]:
    """One row per (case, pass): median ms of sdpa and flash, the speed-up, and the max |diff|."""
    rows = []
    for name, mask, kv_heads, q_factor in mask_cases(n):
        kwargs_sdpa = {"enable_gqa": kv_heads < HEADS} if mask is None else {"attn_mask": sdpa_shape(mask.dense())}
        kwargs_flash = {"enable_gqa": kv_heads < HEADS} if mask is None else {"attn_mask": mask}
        impls = {
            "sdpa": lambda q, k, v, kw=kwargs_sdpa: F.scaled_dot_product_attention(q, k, v, **kw),
            "flash": lambda q, k, v, kw=kwargs_flash: flash_attention(q, k, v, **kw),
        }
        for pass_ in ("forward", "fwd+bwd"):
            backward = pass_ == "fwd+bwd"
            qkv, grad_out = inputs(n, kv_heads, backward, q_factor)
            times, first = {i: [] for i in impls}, {}
            for r in range(rounds + 1):  # round 0 warms up
                for impl in (list(impls) if r % 2 else list(impls)[::-1]):
                    seconds, result = run(impls[impl], qkv, grad_out, backward)
                    if r:
                        times[impl].append(seconds)
                    first.setdefault(impl, result)
            ms = {i: statistics.median(t) * 1e3 for i, t in times.items()}
            diff = max(float((a - b).abs().max()) for a, b in zip(first["flash"], first["sdpa"]))
            rows.append({"case": name, "pass": pass_, "sdpa_ms": ms["sdpa"], "flash_ms": ms["flash"],
                         "speedup": ms["sdpa"] / ms["flash"], "max_diff": diff})
            log(f"  {name}, {pass_}: sdpa {ms['sdpa']:.0f} ms, flash {ms['flash']:.0f} ms")
    return rows


def long_window_child(n: int) -> None:
    """In a fresh process: window 256 at length n, forward + backward, time and peak memory. Prints JSON."""
    mask = SlidingWindowMask(n, left=128, right=128)
    warm, warm_grad = inputs(1024, HEADS, True)
    run(lambda q, k, v: flash_attention(q, k, v, attn_mask=SlidingWindowMask(1024, left=128, right=128)), warm, warm_grad, True)
    qkv, grad_out = inputs(n, HEADS, True)
    with PeakMemory("cpu") as peak:
        seconds, _ = run(lambda q, k, v: flash_attention(q, k, v, attn_mask=mask), qkv, grad_out, True)
    input_bytes = sum(t.numel() * t.element_size() for t in (*qkv, grad_out))
    print(json.dumps({"n": n, "seconds": seconds, "peak_bytes": peak.bytes, "input_bytes": input_bytes}))


def long_window(script: str, threads: int, lengths=(LONG_N // 4, LONG_N)) -> list[dict]:
    """The long case at each length, each in its own process (so the peaks do not mix)."""
    results = []
    for n in lengths:
        command = [sys.executable, script, "--threads", str(threads), "--long-window-child", str(n)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(f"the long-window child failed:\n{done.stderr[-2000:]}")
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return results


def format_masks(rows: list[dict], long_rows: list[dict], header: str) -> str:
    """The markdown section for the README / docs."""
    lines = [header, "", "| case | pass | SDPA ms | flash ms | flash faster by | max abs diff |", "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['pass']} | {r['sdpa_ms']:.0f} | {r['flash_ms']:.0f} | "
                     f"{r['speedup']:.2f}x | {r['max_diff']:.1e} |")
    lines += ["", "| sliding window 256, flash fwd+bwd | seconds | peak MB above inputs | inputs (q, k, v, dO) MB |",
              "|---|---:|---:|---:|"]
    for r in long_rows:
        peak = "n/a" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**20:.0f}"
        lines.append(f"| N = {r['n']} | {r['seconds']:.1f} | {peak} | {r['input_bytes'] / 2**20:.0f} |")
    return "\n".join(lines) + "\n"
