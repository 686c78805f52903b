"""What ``python -m selfattn.distributed.demo`` prints: a plain-text table or one JSON object.

Both read the summary dict the demo builds on rank 0 (settings, per-rank stats, max diffs)
and add what follows from the settings alone: the bytes of K/V each rank sends around
the ring, and what it holds at once against an all-gather of K/V.
"""

from __future__ import annotations

import json

import torch


def ring_traffic(summary: dict) -> dict:
    """Bytes sent per rank (forward, forward + backward) and K/V bytes held at once.

    At step s rank r holds, and passes on, the shard of rank (r - s) mod P. The forward
    sends K and V in P - 1 steps; the backward sends them again in P - 1 steps and their
    gradient accumulators (float32 or better) in P steps, the last one taking them home.
    """
    lengths, world = summary["lengths"], summary["world_size"]
    dtype = getattr(torch, summary["dtype"])
    per_position = 2 * summary["batch"] * summary["heads"] * summary["head_dim"]  # K and V of one position
    kv_bytes = [per_position * n * dtype.itemsize for n in lengths]
    grad_bytes = [per_position * n * torch.promote_types(dtype, torch.float32).itemsize for n in lengths]
    ranks = []
    for rank in range(world):
        held = [(rank - step) % world for step in range(world)]  # whose shard, step by step
        forward = sum(kv_bytes[src] for src in held[:-1])
        backward = forward + (sum(grad_bytes[src] for src in held) if world > 1 else 0)
        ranks.append({"per_step": max(kv_bytes[src] for src in held[:-1]) if world > 1 else 0,
                      "forward": forward, "fwd_bwd": None if summary["forward_only"] else backward})
    return {
        "ranks": ranks,
        # its own shard (kept for the backward), the one in use, the one arriving
        "ring_held_per_rank": min(world, 3) * max(kv_bytes),
        "all_gather_held_per_rank": sum(kv_bytes),
    }


def format_json(summary: dict) -> str:
    """One JSON object: the summary, per-rank bytes sent, and the maxima over ranks."""
    traffic = ring_traffic(summary)
    ranks = [dict(stats, sent_bytes=sent) for stats, sent in zip(summary["ranks"], traffic["ranks"])]
    peaks = [r["peak_bytes"] for r in ranks if r["peak_bytes"] is not None]
    return json.dumps({
        **summary,
        "ranks": ranks,
        "forward_s": max(r["forward_s"] for r in ranks),
        "fwd_bwd_s": None if summary["forward_only"] else max(r["fwd_bwd_s"] for r in ranks),
        "max_peak_bytes": max(peaks) if peaks else None,
        "kv_held_bytes": {"ring": traffic["ring_held_per_rank"], "all_gather": traffic["all_gather_held_per_rank"]},
    })


def format_text(summary: dict) -> str:
    traffic = ring_traffic(summary)
    world, lengths = summary["world_size"], summary["lengths"]
    per_rank = str(lengths[0]) if min(lengths) == max(lengths) else f"{min(lengths)}-{max(lengths)}"
    threads = f"{summary['threads_per_rank']} thread{'s' if summary['threads_per_rank'] > 1 else ''} per rank"
    lines = [
        f"ring attention on {world} rank{'s' if world > 1 else ''} ({summary['backend']}, {summary['device']}, {threads}): "
        f"N = {summary['seq_len']} positions, {per_rank} per rank, {summary['layout']} layout",
        f"batch {summary['batch']}, {summary['heads']} heads, head dim {summary['head_dim']}, {summary['dtype']}, "
        f"{'causal' if summary['causal'] else 'no mask'}, seed {summary['seed']}",
        "",
        f"{'rank':>4}  {'positions':>9}  {'forward s':>9}  {'fwd+bwd s':>9}  {'peak MB':>8}  {'sent MB':>8}",
    ]
    for stats, sent in zip(summary["ranks"], traffic["ranks"]):
        total = sent["forward"] if summary["forward_only"] else sent["fwd_bwd"]
        lines.append(f"{stats['rank']:>4}  {stats['positions']:>9}  {stats['forward_s']:>9.3f}  "
                     f"{_seconds(stats.get('fwd_bwd_s')):>9}  {_mb(stats['peak_bytes']):>8}  {_mb(total):>8}")
    lines.append("")
    during = "the forward" if summary["forward_only"] else "forward + backward"
    memory = summary["ranks"][0]["memory"]
    if summary["ranks"][0]["peak_bytes"] is None:
        lines.append(f"peak MB: not measured: {memory}")
    else:
        lines.append(f"peak MB: during {during}, above what the rank held before (its shards): {memory}")
    if world == 1:
        lines.append("sent MB: nothing is sent with one rank (it holds every key and value)")
    else:
        sent = traffic["ranks"]
        what = "K/V, P-1 steps" if summary["forward_only"] else "K/V P-1 steps forward and P-1 backward, dK/dV P steps"
        lines.append(f"sent MB: bytes each rank sends ({what}); K/V per step: up to {_mb(max(s['per_step'] for s in sent))} MB")
    lines.append(f"K/V held at once per rank: ring up to {_mb(traffic['ring_held_per_rank'])} MB "
                 f"(own shard, the one in use, the one arriving); an all-gather of K/V would hold "
                 f"{_mb(traffic['all_gather_held_per_rank'])} MB")
    diffs = summary["max_diff"]
    if diffs is None:
        lines.append("max |diff| against single-process attention: not checked (--no-check)")
    else:
        found = ", ".join(f"{name} {value:.1e}" for name, value in diffs.items())
        lines.append(f"max |diff| against single-process attention (torch SDPA on rank 0): {found}")
    return "\n".join(lines)


def _mb(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.1f}"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
