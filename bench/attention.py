"""Our reference attention against PyTorch's fused kernel, in one run, with ratios.

`selfattn.scaled_dot_product_attention` is the readable reference: it builds the full
(q_len x kv_len) score matrix from the step functions. This measures what that costs
next to `torch.nn.functional.scaled_dot_product_attention` on the same inputs, forward
and forward + backward, interleaved round by round so load changes hit both alike, and
checks that both give the same output.

    .venv/bin/python bench/attention.py [--rounds 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from selfattn import causal_bottom_right, scaled_dot_product_attention

# (batch, heads, kv_heads, seq, d_head, mask)
CASES = [
    (1, 8, 8, 512, 64, "none"),
    (1, 8, 8, 1024, 64, "none"),
    (1, 8, 8, 1024, 64, "causal"),
    (1, 8, 2, 1024, 64, "gqa"),
    (4, 12, 12, 128, 32, "bool mask"),
]


def inputs(batch, heads, kv_heads, seq, d, requires_grad):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(batch, heads, seq, d, generator=g)
    k = torch.randn(batch, kv_heads, seq, d, generator=g)
    v = torch.randn(batch, kv_heads, seq, d, generator=g)
    return [t.requires_grad_(requires_grad) for t in (q, k, v)]


def kwargs_for(mask: str, seq: int) -> dict:
    if mask == "causal":
        return {"is_causal": True}
    if mask == "gqa":
        return {"enable_gqa": True}
    if mask == "bool mask":
        return {"attn_mask": causal_bottom_right(seq, seq) | (torch.rand(seq, seq, generator=torch.Generator().manual_seed(1)) < 0.5)}
    return {}


def timed(fn, q, k, v, kwargs, backward: bool) -> float:
    start = time.perf_counter()
    out = fn(q, k, v, **kwargs)
    if backward:
        out.sum().backward()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, float32, median of {args.rounds} rounds")
    print(f"{'case':<34} {'pass':<9} {'torch ms':>9} {'ours ms':>9} {'ours/torch':>10} {'max |diff|':>11}")
    for batch, heads, kv_heads, seq, d, mask in CASES:
        kwargs = kwargs_for(mask, seq)
        name = f"B{batch} H{heads}/{kv_heads} N{seq} d{d} {mask}"
        q, k, v = inputs(batch, heads, kv_heads, seq, d, False)
        diff = float((scaled_dot_product_attention(q, k, v, **kwargs) - F.scaled_dot_product_attention(q, k, v, **kwargs)).abs().max())
        for backward in (False, True):
            q, k, v = inputs(batch, heads, kv_heads, seq, d, backward)
            times = {"torch": [], "ours": []}
            for _ in range(args.rounds):
                times["torch"].append(timed(F.scaled_dot_product_attention, q, k, v, kwargs, backward))
                times["ours"].append(timed(scaled_dot_product_attention, q, k, v, kwargs, backward))
            t_torch, t_ours = (statistics.median(times[key]) * 1e3 for key in ("torch", "ours"))
            label = "fwd+bwd" if backward else "forward"
            print(f"{name:<34} {label:<9} {t_torch:9.1f} {t_ours:9.1f} {t_ours / t_torch:9.2f}x {diff:11.1e}")


if __name__ == "__main__":
    main()
