"""The tile loops shared between one-core threads (kernels/workers.py), as they run while another process holds a core.

A quiet test machine never takes that path by itself, so these tests switch it on and
compare every output and gradient with the same call run in one thread, over the cases
whose memory the threads share out: plain, causal, GQA, a structured window, a float mask
that learns, a score_mod with a learnable table, flash-attn's softcap and ALiBi.
"""

from __future__ import annotations

import threading

import pytest
import torch

import selfattn as sa
from selfattn.kernels import workers


@pytest.fixture
def contended(monkeypatch):
    """Every run of units is shared out, on 2 torch threads at least."""
    threads = torch.get_num_threads()
    torch.set_num_threads(max(2, threads))
    monkeypatch.setattr(workers, "cores_are_shared", lambda: True)
    yield
    torch.set_num_threads(threads)


def tensors(hq=4, hk=4, n=300, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, hq, n, d, generator=g, dtype=torch.float64) * 2  # attention far from uniform
    k = torch.randn(2, hk, n, d, generator=g, dtype=torch.float64) * 2
    v = torch.randn(2, hk, n, d, generator=g, dtype=torch.float64)
    return q, k, v


TABLE = torch.randn(700, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
CASES = {
    "plain": lambda q, k, v, extra: sa.flash_attention(q, k, v, block_q=64, block_k=64),
    "causal": lambda q, k, v, extra: sa.flash_attention(q, k, v, is_causal=True, block_q=64, block_k=32),
    "gqa": lambda q, k, v, extra: sa.flash_attention(q, k[:, :2], v[:, :2], is_causal=True, enable_gqa=True,
                                                      block_q=64, block_k=64),
    "window": lambda q, k, v, extra: sa.flash_attention(
        q, k, v, attn_mask=sa.sliding_window_mask(300, left=40, right=10, structured=True), block_q=32, block_k=32),
    "float mask": lambda q, k, v, extra: sa.flash_attention(q, k, v, attn_mask=extra, block_q=64, block_k=64),
    "score_mod": lambda q, k, v, extra: sa.flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: s + extra[i - j + 350]),
    "softcap alibi": lambda q, k, v, extra: sa.flash_attn_func(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True, softcap=5.0,
        alibi_slopes=torch.tensor([0.5, 0.25, 0.125, 0.0625], dtype=torch.float64)).transpose(1, 2),
}


def run(case):
    q, k, v = (t.requires_grad_() for t in tensors())
    extra = None
    if case == "float mask":
        extra = torch.randn(300, 300, dtype=torch.float64, generator=torch.Generator().manual_seed(4)).requires_grad_()
    elif case == "score_mod":
        extra = TABLE.clone().requires_grad_()
    out = CASES[case](q, k, v, extra)
    grad = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(1))
    sources = (q, k, v) if extra is None else (q, k, v, extra)
    return (out.detach(), *torch.autograd.grad(out, sources, grad))


@pytest.mark.parametrize("case", sorted(CASES))
def test_shared_out_tiles_give_the_one_thread_results(case, monkeypatch):
    alone = run(case)
    threads = torch.get_num_threads()
    torch.set_num_threads(max(2, threads))
    monkeypatch.setattr(workers, "cores_are_shared", lambda: True)
    try:
        shared = run(case)
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(shared, alone):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


def test_the_units_really_run_on_the_workers_and_errors_come_back(contended):
    seen = set()

    def mod(s, b, h, i, j):
        seen.add(threading.current_thread().name)
        return s
    q, k, v = tensors(n=600)
    sa.flex_attention(q, k, v, score_mod=mod)
    assert any(name.startswith("selfattn-tiles") for name in seen)

    def broken(s, b, h, i, j):
        raise ValueError("a score_mod that fails")
    with pytest.raises(ValueError, match="fails"):
        sa.flex_attention(q, k, v, score_mod=broken)
    assert torch.get_num_threads() >= 2  # the workers' one-thread setting stays in the workers


def test_contention_is_read_from_the_cpu_time_of_long_runs(monkeypatch):
    monkeypatch.setattr(workers, "_contended", False)
    monkeypatch.setattr(workers, "_warm", False)
    workers._measured(2, 1.0, 1.3)  # the process's first long run: not counted
    assert not workers.cores_are_shared()
    workers._measured(2, 1.0, 1.3)  # a busy-loop process took most of a core
    assert workers.cores_are_shared()
    workers._measured(2, 0.001, 2.0)  # too short to tell: unchanged
    assert workers.cores_are_shared()
    workers._measured(2, 1.0, 1.97)  # the cores are back
    assert not workers.cores_are_shared()


def test_the_callers_modes_reach_the_workers(contended):
    """Inference mode and autocast are per thread: the workers take the caller's, so writing into
    an inference tensor works and the products run in the caller's autocast dtype."""
    q, k, v = (t.float() for t in tensors(n=600))
    expected = sa.flash_attention(q, k, v, block_q=64, block_k=64)
    with torch.inference_mode():
        out = sa.flash_attention(q, k, v, block_q=64, block_k=64)
    torch.testing.assert_close(out, expected)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = sa.flash_attention(q, k, v, block_q=64, block_k=64)
    torch.testing.assert_close(low.float(), expected, atol=0.1, rtol=0.1)
