"""The Triton kernel, run by Triton's interpreter on CPU tensors (no GPU needed).

Against independent references: torch's scaled_dot_product_attention on the dense mask
(outputs and gradients), the log-sum-exp of the dense scores (lse), flash-attn's semantics
written out (softcap, ALiBi), and the torch kernel beside it; and both kernels visit the same
tiles. conftest.py sets TRITON_INTERPRET=1 before anything imports triton: the kernels are
then made for the interpreter.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="triton is not installed (pip install 'selfattn[gpu]'; CI installs it)")
import selfattn.kernels.triton_kernels as triton_kernels  # noqa: E402 - after conftest chose the interpreter

import selfattn as sa  # noqa: E402
from selfattn.errors import OptionError  # noqa: E402
from selfattn.kernels import backend as backends  # noqa: E402
from selfattn.kernels import last_backend  # noqa: E402
from selfattn.kernels.flash_attn_api import flash_attn_func, flash_attn_varlen_func  # noqa: E402
from selfattn.kernels.flash_tiles import count_tiles  # noqa: E402
from selfattn.masks import causal_mask, document_mask, padding_mask, sliding_window_mask  # noqa: E402
from selfattn.masks.block_mask import create_block_mask  # noqa: E402
from flash_attn_reference import reference as flash_attn_reference  # noqa: E402

TOL = dict(atol=3e-5, rtol=3e-5)

if not triton_kernels.INTERPRETED:  # a machine whose kernels were made for its GPU: these tests are for the CPU
    pytest.skip("the Triton kernels were imported for a GPU before this module", allow_module_level=True)


def _inputs(batch, heads, q_len, kv_len, d, d_v=None, kv_heads=None, seed=0):
    """q, k, v whose attention is far from uniform (scores of a few units), float32."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, q_len, d, generator=g) * 1.5
    k = torch.randn(batch, kv_heads or heads, kv_len, d, generator=g) * 1.5
    v = torch.randn(batch, kv_heads or heads, kv_len, d_v or d, generator=g)
    return q, k, v


def _run(q, k, v, backend, **options):
    """(O, lse, (dQ, dK, dV[, dmask])) for a random upstream gradient."""
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    mask = options.get("attn_mask")
    if isinstance(mask, torch.Tensor) and mask.is_floating_point():
        options = dict(options, attn_mask=mask.clone().requires_grad_())
        leaves.append(options["attn_mask"])
    out, lse = sa.flash_attention(*leaves[:3], return_lse=True, backend=backend, **options)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    out.backward(grad)
    return out.detach(), lse, [t.grad for t in leaves], grad


def _dense_reference(q, k, v, dense, grad, scale=None, float_mask=False):
    """SDPA on the dense mask (zeros for rows that see nothing) and the scores' log-sum-exp."""
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    mask = dense
    if float_mask:
        mask = dense.clone().requires_grad_()
        leaves.append(mask)
    kk, vv = leaves[1], leaves[2]
    if kk.shape[-3] != q.shape[-3]:
        kk, vv = (t.repeat_interleave(q.shape[-3] // t.shape[-3], dim=-3) for t in (kk, vv))
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = leaves[0] @ kk.transpose(-2, -1) * scale
    scores = scores + mask if float_mask else scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores.detach(), dim=-1)
    seen = torch.isfinite(lse)[..., None]
    bool_mask = mask if not float_mask else mask
    out = F.scaled_dot_product_attention(leaves[0], kk, vv, attn_mask=bool_mask, scale=scale)
    out = torch.where(seen, out, 0.0)
    out.backward(grad)
    return out.detach(), lse, [t.grad for t in leaves]


def _masks():
    """(name, q/k/v shape, flash_attention options, dense bool mask or None)."""
    full = None
    docs = causal_mask(200, structured=True) & document_mask([33, 50, 17, 1, 99], structured=True)
    per_head = torch.rand(2, 3, 61, 77, generator=torch.Generator().manual_seed(3)) > 0.4
    prefix = create_block_mask(lambda b, h, q, kv: (kv < 10) | (kv <= q), None, None, 100, 100, BLOCK_SIZE=16)
    return [
        ("none", (2, 3, 70, 90, 16), {}, full),
        ("causal top-left", (2, 2, 70, 90, 24), dict(is_causal=True), causal_mask(70, 90)),
        ("causal bottom-right", (1, 3, 45, 130, 32), dict(attn_mask=causal_mask(45, 130, align="bottom_right",
                                                                            structured=True)),
         causal_mask(45, 130, align="bottom_right")),
        ("window", (1, 2, 150, 150, 24), dict(attn_mask=sliding_window_mask(150, left=20, structured=True)),
         sliding_window_mask(150, left=20)),
        ("window both sides, bottom-right", (2, 1, 40, 100, 16),
         dict(attn_mask=sliding_window_mask(40, 100, left=7, right=5, align="bottom_right", structured=True)),
         sliding_window_mask(40, 100, left=7, right=5, align="bottom_right")),
        ("causal documents", (1, 1, 200, 200, 64), dict(attn_mask=docs), docs.dense()),
        ("padding", (2, 2, 50, 90, 16), dict(attn_mask=padding_mask(torch.tensor([90, 31]), 90, structured=True)),
         padding_mask(torch.tensor([90, 31]), 90)),
        ("bool per head", (2, 3, 61, 77, 16), dict(attn_mask=per_head), per_head),
        ("BlockMask", (1, 2, 100, 100, 40), dict(attn_mask=prefix), prefix.dense()),
        ("decode", (2, 2, 1, 37, 16), dict(attn_mask=causal_mask(1, 37, align="bottom_right", structured=True)),
         causal_mask(1, 37, align="bottom_right")),
    ]


@pytest.mark.parametrize("name, shape, options, dense", _masks(), ids=[m[0] for m in _masks()])
def test_outputs_lse_and_gradients_against_sdpa_and_the_torch_kernel(name, shape, options, dense):
    batch, heads, q_len, kv_len, d = shape
    q, k, v = _inputs(batch, heads, q_len, kv_len, d)
    out, lse, grads, upstream = _run(q, k, v, "triton", **options)
    assert last_backend() == "triton"
    dense = torch.ones(q_len, kv_len, dtype=torch.bool) if dense is None else dense
    ref_out, ref_lse, ref_grads = _dense_reference(q, k, v, dense, upstream)
    torch.testing.assert_close(out, ref_out, **TOL)
    torch.testing.assert_close(lse, ref_lse, **TOL)
    for mine, theirs in zip(grads, ref_grads):
        torch.testing.assert_close(mine, theirs, **TOL)
    t_out, t_lse, t_grads, _ = _run(q, k, v, "torch", **options)
    torch.testing.assert_close(out, t_out, **TOL)
    torch.testing.assert_close(lse, t_lse, **TOL)
    for mine, theirs in zip(grads, t_grads):
        torch.testing.assert_close(mine, theirs, **TOL)


@pytest.mark.parametrize("bias_shape", [(1, 3, 47, 83), (83,), (2, 1, 1, 83)])
def test_a_float_mask_is_added_tile_by_tile_and_gets_its_gradient(bias_shape):
    q, k, v = _inputs(2, 3, 47, 83, 16)
    bias = torch.randn(bias_shape, generator=torch.Generator().manual_seed(5)) * 2
    bias = bias.masked_fill(torch.rand(bias_shape, generator=torch.Generator().manual_seed(6)) > 0.8, float("-inf"))
    out, lse, grads, upstream = _run(q, k, v, "triton", attn_mask=bias)
    ref_out, ref_lse, ref_grads = _dense_reference(q, k, v, bias, upstream, float_mask=True)
    torch.testing.assert_close(out, ref_out, **TOL)
    torch.testing.assert_close(lse, ref_lse, **TOL)
    for mine, theirs in zip(grads, ref_grads):
        torch.testing.assert_close(mine, theirs, **TOL)


def test_a_row_that_sees_no_key_gives_zeros_and_lse_minus_inf():
    q, k, v = _inputs(1, 2, 33, 33, 16)
    hidden = torch.ones(33, 33, dtype=torch.bool).tril()
    hidden[[4, 20]] = False
    out, lse, grads, upstream = _run(q, k, v, "triton", attn_mask=hidden)
    assert bool((out[..., [4, 20], :] == 0).all()) and bool(torch.isneginf(lse[..., [4, 20]]).all())
    assert bool((grads[0][..., [4, 20], :] == 0).all())
    ref_out, _, ref_grads = _dense_reference(q, k, v, hidden, upstream)
    torch.testing.assert_close(out, ref_out, **TOL)
    for mine, theirs in zip(grads, ref_grads):
        torch.testing.assert_close(mine, theirs, **TOL)


@pytest.mark.parametrize("causal", [False, True])
def test_gqa_shares_keys_and_values_without_copying_them(causal):
    q, k, v = _inputs(2, 3, 66, 66, 32, d_v=16, kv_heads=1)  # 3 query heads on one key/value head
    out, lse, grads, upstream = _run(q, k, v, "triton", is_causal=causal, enable_gqa=True)
    dense = torch.ones(66, 66, dtype=torch.bool).tril() if causal else torch.ones(66, 66, dtype=torch.bool)
    ref_out, ref_lse, ref_grads = _dense_reference(q, k, v, dense, upstream)
    torch.testing.assert_close(out, ref_out, **TOL)
    torch.testing.assert_close(lse, ref_lse, **TOL)
    for mine, theirs in zip(grads, ref_grads):
        torch.testing.assert_close(mine, theirs, **TOL)


@pytest.fixture
def triton_for_cpu(monkeypatch):
    """backend="auto" treats CPU tensors as a GPU's: the paths that choose on their own take Triton."""
    monkeypatch.setattr(backends, "on_gpu", lambda tensor: True)


@pytest.mark.parametrize("softcap, slopes, window", [(0.0, True, (-1, -1)), (20.0, False, (-1, -1)),
                                                     (10.0, True, (9, 0)), (5.0, True, (-1, -1))])
def test_softcap_and_alibi_against_flash_attns_semantics(triton_for_cpu, softcap, slopes, window):
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 50, 2, 32, generator=g) * 2  # (batch, seq, heads, d): flash-attn's layout
    k = torch.randn(2, 73, 1, 32, generator=g) * 2
    v = torch.randn(2, 73, 1, 32, generator=g)
    alibi = torch.rand(2, 2, generator=g) if slopes else None
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = flash_attn_func(*leaves, softcap=softcap, alibi_slopes=alibi, window_size=window)
    assert last_backend() == "triton"
    grad = torch.randn(out.shape, generator=g)
    out.backward(grad)
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref, _ = flash_attn_reference(*ref_leaves, softcap=softcap, slopes=alibi, window=window)
    ref.backward(grad)
    torch.testing.assert_close(out, ref, **TOL)
    for mine, theirs in zip(leaves, ref_leaves):
        torch.testing.assert_close(mine.grad, theirs.grad, **TOL)


def test_varlen_alibi_and_window_match_the_torch_kernel(monkeypatch):
    g = torch.Generator().manual_seed(4)
    lengths = [17, 40, 3]
    offsets = torch.tensor([0, 17, 57, 60], dtype=torch.int32)
    q, k = (torch.randn(60, 2, 16, generator=g) * 2 for _ in range(2))
    v = torch.randn(60, 2, 16, generator=g)
    slopes = torch.rand(3, 2, generator=g)
    results = []
    for on_gpu in (True, False):
        monkeypatch.setattr(backends, "on_gpu", lambda tensor, answer=on_gpu: answer)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = flash_attn_varlen_func(*leaves, offsets, offsets, max(lengths), max(lengths), causal=True,
                                     window_size=(6, 0), alibi_slopes=slopes, softcap=8.0)
        assert last_backend() == ("triton" if on_gpu else "torch")
        out.backward(torch.ones_like(out))
        results.append([out.detach()] + [t.grad for t in leaves])
    for mine, theirs in zip(*results):
        torch.testing.assert_close(mine, theirs, **TOL)


@pytest.mark.parametrize("options", [
    dict(is_causal=True),
    dict(attn_mask=sliding_window_mask(150, left=40, structured=True)),
    dict(attn_mask=causal_mask(150, structured=True) & document_mask([70, 80], structured=True)),
    dict(attn_mask=torch.rand(150, 150, generator=torch.Generator().manual_seed(0)) > 0.999),
], ids=["causal", "window", "documents", "sparse bool"])
def test_both_kernels_visit_the_same_tiles(options):
    q, k, v = _inputs(1, 2, 150, 150, 16)
    seen = {}
    for backend in ("triton", "torch"):
        with count_tiles() as tiles:
            _run(q, k, v, backend, block_q=32, block_k=32, **options)
        seen[backend] = tiles
    for kind in ("forward", "backward"):
        mine = [t[1:] for t in seen["triton"] if t[0] == kind]
        theirs = [t[1:] for t in seen["torch"] if t[0] == kind]
        assert sorted(set(mine)) == sorted(theirs)
        assert len(mine) == (2 if kind == "backward" else 1) * len(theirs)  # the backward's two kernels: each tile twice
    assert len(set(seen["torch"])) < 2 * 25  # the mask let whole tiles go: not all 5 x 5 per pass


def test_auto_takes_the_torch_kernel_on_cpu_and_says_why():
    q, k, v = _inputs(1, 2, 9, 9, 16)
    expected = sa.flash_attention(q, k, v, is_causal=True, backend="torch")
    assert last_backend() == "torch" and last_backend().reason == "backend='torch'"
    got = sa.flash_attention(q, k, v, is_causal=True)  # backend="auto"
    assert last_backend() == "torch" and "CPU tensors" in last_backend().reason
    torch.testing.assert_close(got, expected, atol=0, rtol=0)


def test_auto_takes_triton_for_gpu_tensors_and_falls_back_with_a_reason(triton_for_cpu, monkeypatch):
    q, k, v = _inputs(1, 2, 40, 40, 16)
    ours = sa.flash_attention(q, k, v, is_causal=True)
    assert last_backend() == "triton" and last_backend().reason == "CUDA tensors and triton installed"
    torch.testing.assert_close(ours, sa.flash_attention(q, k, v, is_causal=True, backend="torch"), **TOL)
    declined = {
        "dropout runs on the torch kernel only": dict(dropout_p=0.1),
        "tiles are powers of two from 16, got block_q=24": dict(block_q=24),
        "float32, float16 and bfloat16, not torch.float64": dict(dtype=torch.float64),
    }
    for reason, options in declined.items():
        dtype = options.pop("dtype", torch.float32)
        sa.flash_attention(q.to(dtype), k.to(dtype), v.to(dtype), is_causal=True, **options)
        assert last_backend() == "torch" and reason in last_backend().reason
        with pytest.raises(OptionError, match="backend='triton' cannot run this call: .*" + reason.split(",")[0]):
            sa.flash_attention(q.to(dtype), k.to(dtype), v.to(dtype), is_causal=True, backend="triton", **options)
    score_mod = lambda score, b, h, q_idx, kv_idx: score * 2  # noqa: E731 - not ALiBi: the torch kernel
    sa.flex_attention(q, k, v, score_mod=score_mod)
    assert last_backend() == "torch" and "score_mod" in last_backend().reason
    monkeypatch.setattr(backends, "triton_installed", lambda: False)  # without triton nothing changes
    sa.flash_attention(q, k, v, is_causal=True)
    assert last_backend() == "torch" and "pip install 'selfattn[gpu]'" in last_backend().reason


def test_a_bad_backend_name_and_cpu_tensors_outside_the_interpreter_are_one_line_errors(monkeypatch):
    q = torch.randn(1, 1, 4, 16)
    with pytest.raises(OptionError, match="backend must be one of 'auto', 'torch', 'triton', got 'cuda'"):
        sa.flash_attention(q, q, q, backend="cuda")
    monkeypatch.setattr(backends, "interpreting", lambda: False)
    with pytest.raises(OptionError, match="Triton needs CUDA tensors"):
        sa.flash_attention(q, q, q, backend="triton")


def test_multihead_attention_with_attn_impl_flash_runs_triton_on_the_gpu(triton_for_cpu):
    torch.manual_seed(0)
    x = torch.randn(2, 37, 32) * 3
    reference = sa.MultiHeadAttention(32, 4, n_kv_heads=2)
    flash = sa.MultiHeadAttention(32, 4, n_kv_heads=2, attn_impl="flash")
    flash.load_state_dict(reference.state_dict())
    expected = reference(x, is_causal=True)
    got = flash(x, is_causal=True)
    assert last_backend() == "triton"
    torch.testing.assert_close(got, expected, **TOL)


def test_the_transformers_integration_runs_triton_on_the_gpu(triton_for_cpu):
    pytest.importorskip("transformers", reason="the reference is transformers' own sdpa function")
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from selfattn.integrations import transformers as adapter

    layer = torch.nn.Module()
    layer.is_causal, layer.num_key_value_groups = True, 2
    g = torch.Generator().manual_seed(8)
    q = torch.randn(2, 21, 4, 16, generator=g).transpose(1, 2)  # (B, H, S, d) views, as layers pass them
    k, v = torch.randn(2, 2, 2, 21, 16, generator=g).unbind(0)
    for mask in (None, torch.rand(2, 1, 21, 21, generator=g) > 0.3):
        if mask is not None:
            mask[..., 0] = True
        expected, _ = sdpa_attention_forward(layer, q, k, v, mask, dropout=0.0, scaling=0.4)
        got, _ = adapter.flash_attention_forward(layer, q, k, v, mask, scaling=0.4, dropout=0.0)
        assert last_backend() == "triton"
        torch.testing.assert_close(got, expected, **TOL)


@pytest.fixture
def bfloat16_products(monkeypatch):
    """The interpreter keeps bfloat16 as its 16 stored bits and its tl.dot multiplies those bits as
    integers (garbage, on any kernel). A GPU multiplies the numbers: products exact in float32,
    summed in float32. This mends the interpreter's dot that way for one test, so that the rest of
    the kernel's bfloat16 path (loads, the casts of P and dS, stores) is checked."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter.InterpreterBuilder.create_dot

    def as_float32(handle):
        if handle.dtype != tl.bfloat16:
            return handle
        return interpreter.TensorHandle((handle.data.astype(np.uint32) << 16).view(np.float32), tl.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original(self, as_float32(a), as_float32(b), d, input_precision, max_num_imprecise_acc)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", create_dot)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_as_close_to_float32_as_torchs_own(dtype, bfloat16_products):
    """float16 / bfloat16 in and out, float32 inside (the products' sums, the softmax, lse): our error
    against the float32 result at most twice SDPA's in the same dtype (three times in bfloat16: P and
    dS go into their products rounded to bfloat16's 8 bits, as in FlashAttention-2, where SDPA's CPU
    kernel keeps them in float32; measured 1.9x on dK)."""
    q, k, v = _inputs(1, 2, 70, 70, 32)
    exact, _, exact_grads, upstream = _run(q, k, v, "torch", is_causal=True)
    ours = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    out = sa.flash_attention(*ours, is_causal=True, backend="triton")
    out.backward(upstream.to(dtype))
    theirs = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*theirs, is_causal=True)
    ref.backward(upstream.to(dtype))
    assert out.dtype == dtype
    for mine, torchs, truth in [(out, ref, exact)] + [(a.grad, b.grad, c) for a, b, c in zip(ours, theirs, exact_grads)]:
        error, torch_error = ((t.float() - truth).abs().max().item() for t in (mine, torchs))
        assert error <= (2 if dtype == torch.float16 else 3) * torch_error + 1e-3, (error, torch_error)


@settings(max_examples=12, deadline=None)
@given(q_len=st.integers(1, 200), kv_len=st.integers(1, 200), heads=st.integers(1, 3), d=st.sampled_from([16, 24, 40, 64]),
       kind=st.sampled_from(["none", "causal", "bottom-right", "window", "documents", "bool"]),
       left=st.integers(0, 40), right=st.integers(0, 40), seed=st.integers(0, 2**16))
def test_any_lengths_and_masks_against_sdpa(q_len, kv_len, heads, d, kind, left, right, seed):
    if kind == "documents":
        kv_len = q_len
        cuts = sorted(torch.randint(0, q_len + 1, (3,), generator=torch.Generator().manual_seed(seed)).tolist())
        lengths = [b - a for a, b in zip([0] + cuts, cuts + [q_len]) if b > a]
        structured = document_mask(lengths, structured=True)
        options, dense = dict(attn_mask=structured), structured.dense()
    elif kind == "bool":
        dense = torch.rand(heads, q_len, kv_len, generator=torch.Generator().manual_seed(seed)) > 0.5
        dense[..., 0] = True
        options = dict(attn_mask=dense)
    else:
        structured = {"none": None, "causal": causal_mask(q_len, kv_len, structured=True),
                      "bottom-right": causal_mask(q_len, kv_len, align="bottom_right", structured=True),
                      "window": sliding_window_mask(q_len, kv_len, left=left, right=right, structured=True)}[kind]
        options = {} if structured is None else dict(attn_mask=structured)
        dense = torch.ones(q_len, kv_len, dtype=torch.bool) if structured is None else structured.dense()
    q, k, v = _inputs(1, heads, q_len, kv_len, d, seed=seed)
    out, lse, grads, upstream = _run(q, k, v, "triton", **options)
    ref_out, ref_lse, ref_grads = _dense_reference(q, k, v, dense, upstream)
    torch.testing.assert_close(out, ref_out, **TOL)
    torch.testing.assert_close(lse, ref_lse, **TOL)
    for mine, theirs in zip(grads, ref_grads):
        torch.testing.assert_close(mine, theirs, **TOL)


@pytest.mark.parametrize("q_len, kv_len", [(0, 5), (5, 0), (0, 0)])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_no_queries_or_no_keys(backend, q_len, kv_len):
    q, k, v = _inputs(1, 2, q_len, kv_len, 16)
    out, lse, grads, _ = _run(q, k, v, backend)
    assert out.shape == (1, 2, q_len, 16) and bool((out == 0).all()) and bool(torch.isneginf(lse).all())
    assert [tuple(g.shape) for g in grads] == [tuple(t.shape) for t in (q, k, v)] and all(bool((g == 0).all()) for g in grads)


def test_the_torch_kernel_never_imports_triton():
    """Triton is optional: a flash call on the CPU (backend auto) leaves it unimported."""
    import subprocess
    import sys

    code = ("import sys, torch, selfattn as sa; q = torch.randn(1, 2, 9, 8); sa.flash_attention(q, q, q, is_causal=True); "
            "sa.flash_attn_func(q.transpose(1, 2), q.transpose(1, 2), q.transpose(1, 2), softcap=3.0); "
            "print('triton' in sys.modules, 'selfattn.kernels.triton_flash' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.split() == ["False", "False"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("d_head", [16, 64, 96, 128, 256])
def test_gpu_tiles_fit_in_shared_memory(d_head, dtype):
    """The GPU's default tiles (not run here): powers of two from 16, and the tiles one program
    keeps (forward: Q_i, then K_j and V_j in two pipeline stages; dK/dV: K_j, V_j, then Q_i and
    dO_i in two stages) within 200 KB, under the H100/H200's 227 KB of shared memory per block."""
    from selfattn.kernels.triton_flash import default_blocks

    size = torch.tensor([], dtype=dtype).element_size()
    width = max(16, 1 << (d_head - 1).bit_length())
    (fq, fk), (bq, bk) = default_blocks(d_head, dtype, torch.device("cuda"))
    for block in (fq, fk, bq, bk):
        assert block >= 16 and block & (block - 1) == 0
    assert (fq * width + 2 * 2 * fk * width) * size <= 200_000
    assert (2 * bk * width + 2 * 2 * bq * width) * size <= 200_000


def test_attention_probs_from_lse_works_unchanged_on_tritons_lse():
    q, k, v = _inputs(2, 2, 45, 60, 16, kv_heads=1)
    window = sliding_window_mask(45, 60, left=9, align="bottom_right", structured=True)
    _, lse = sa.flash_attention(q, k, v, attn_mask=window, enable_gqa=True, return_lse=True, backend="triton")
    probs = sa.attention_probs_from_lse(q, k, lse, rows=[0, 17, 44], attn_mask=window.dense(), enable_gqa=True)
    scores = (q @ k.transpose(-2, -1) / 4).masked_fill(~window.dense(), float("-inf"))  # d = 16: scale 1/4
    torch.testing.assert_close(probs, torch.softmax(scores, dim=-1)[..., [0, 17, 44], :], **TOL)


def test_a_masks_tables_are_made_once_and_kept_while_it_lives(monkeypatch):
    calls = []
    mask = causal_mask(90, structured=True) & padding_mask(torch.tensor([90, 61]), 90, structured=True)  # a TABLE mask
    original = type(mask).allowed
    monkeypatch.setattr(type(mask), "allowed", lambda self, rows, cols: calls.append(1) or original(self, rows, cols))
    q, k, v = _inputs(2, 2, 90, 90, 16)
    first = sa.flash_attention(q, k, v, attn_mask=mask, backend="triton")
    made = len(calls)
    again = sa.flash_attention(q, k, v, attn_mask=mask, backend="triton")
    assert made > 0 and len(calls) == made  # the second call gathered no bits
    torch.testing.assert_close(again, first, atol=0, rtol=0)
    other = causal_mask(90, structured=True) & padding_mask(torch.tensor([33, 90]), 90, structured=True)
    ref, _, _ = _dense_reference(q, k, v, other.dense(), torch.zeros(2, 2, 90, 16))
    torch.testing.assert_close(sa.flash_attention(q, k, v, attn_mask=other, backend="triton"), ref, **TOL)
    assert len(calls) > made  # another mask: its own tables


def _document_masks():
    docs = document_mask([30, 1, 49, 40], structured=True)
    return {
        "documents": (docs, triton_kernels.DOCS),
        "causal documents": (causal_mask(120, structured=True) & docs, triton_kernels.DOCS),
        "documents in a window": (docs & sliding_window_mask(120, left=9, right=3, structured=True), triton_kernels.DOCS),
        "documents, causal and a window": (docs & causal_mask(120, structured=True)
                                           & sliding_window_mask(120, left=20, structured=True), triton_kernels.TABLE),
        "documents or a window": (docs | sliding_window_mask(120, left=5, structured=True), triton_kernels.TABLE),
    }


@pytest.mark.parametrize("name", list(_document_masks()))
def test_packed_documents_are_compared_in_the_kernel(name):
    """A DocumentMask alone or with one band is checked in the kernel from each query's and key's
    document (DOCS); other combinations take the bits of their PARTIAL tiles (TABLE). Both right."""
    from selfattn.kernels.triton_tables import block_tables, mask_args

    mask, kind = _document_masks()[name]
    tables = block_tables(mask, 120, 120, 64, 64, "cpu")
    assert mask_args(mask, None, tables, (1, 2), 120, 120, 64, 64, "cpu").kind == kind
    q, k, v = _inputs(1, 2, 120, 120, 16)
    out, lse, grads, upstream = _run(q, k, v, "triton", attn_mask=mask, block_q=32, block_k=32)
    ref_out, ref_lse, ref_grads = _dense_reference(q, k, v, mask.dense(), upstream)
    torch.testing.assert_close(out, ref_out, **TOL)
    torch.testing.assert_close(lse, ref_lse, **TOL)
    for mine, theirs in zip(grads, ref_grads):
        torch.testing.assert_close(mine, theirs, **TOL)
