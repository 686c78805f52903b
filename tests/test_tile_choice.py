"""Tiles fitted to the machine (``selfattn.kernels.tile_choice``): measured once, kept, never changing results.

The probe is made small here (64 tokens, choices from 128 tokens on) so that each test
measures in milliseconds; the choice's logic is the same at the real sizes.
"""

from __future__ import annotations

import json

import pytest
import torch

import selfattn as sa
from selfattn.kernels import flash
from selfattn.kernels import tile_fit as choice_module
from selfattn.kernels.tile_fit import CACHE_ENV, CANDIDATES, tile_choice


@pytest.fixture(autouse=True)
def small_probe(monkeypatch):
    monkeypatch.setattr(choice_module, "PROBE_LENGTH", 64)
    monkeypatch.setattr(choice_module, "MIN_LENGTH", 128)
    monkeypatch.delenv(CACHE_ENV, raising=False)
    choice_module.forget()
    yield
    choice_module.forget()


def inputs(n=320, heads=4, kv_heads=4):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(1, heads, n, 32, generator=g), torch.randn(1, kv_heads, n, 32, generator=g),
            torch.randn(1, kv_heads, n, 32, generator=g))


def test_the_chosen_tiles_give_the_fixed_tiles_results(monkeypatch):
    q, k, v = inputs()
    seen = []
    real = flash.flash_forward
    monkeypatch.setattr(flash, "flash_forward", lambda *a, **kw: seen.append((a[5], a[6])) or real(*a, **kw))
    with torch.no_grad():
        auto = sa.flash_attention(q, k, v)
    chosen = tile_choice(320, 320, heads=4, d_head=32)
    assert chosen.source == "measured" and chosen.block_q == chosen.block_k in CANDIDATES
    assert set(chosen.timings) == {(size, size) for size in CANDIDATES}
    fastest = min(chosen.timings, key=chosen.timings.get)
    margin = chosen.timings[fastest] <= (1 - choice_module.MARGIN) * chosen.timings[(512, 512)]
    assert (chosen.block_q, chosen.block_k) == (fastest if margin else (512, 512)), chosen
    assert seen[-1] == (chosen.block_q, chosen.block_k)
    with torch.no_grad():
        fixed = sa.flash_attention(q, k, v, block_q=chosen.block_q, block_k=chosen.block_k)
        other = sa.flash_attention(q, k, v, block_q=128, block_k=96)
    assert torch.equal(auto, fixed)
    torch.testing.assert_close(auto, other, atol=1e-6, rtol=1e-5)  # float32 reordering only
    torch.testing.assert_close(auto, torch.nn.functional.scaled_dot_product_attention(q, k, v), atol=1e-5, rtol=1e-5)
    # Kept in memory: a second call measures nothing.
    monkeypatch.setattr(choice_module, "_measure", lambda *a: pytest.fail("measured twice"))
    assert tile_choice(320, 320, heads=4, d_head=32) == chosen


def test_given_blocks_win_and_short_or_masked_calls_keep_the_default(monkeypatch):
    q, k, v = inputs()
    monkeypatch.setattr(choice_module, "_measure", lambda *a: pytest.fail("nothing should be measured"))
    seen = []
    real = flash.flash_forward
    monkeypatch.setattr(flash, "flash_forward", lambda *a, **kw: seen.append((a[5], a[6])) or real(*a, **kw))
    with torch.no_grad():
        sa.flash_attention(q, k, v, block_q=64, block_k=32)
        sa.flash_attention(q[..., :100, :], k[..., :100, :], v[..., :100, :])
        sa.flash_attention(q, k, v, is_causal=True)
    assert seen[0] == (64, 32) and seen[1] == (512, 512)
    given = tile_choice(4096, 4096, block_q=64, block_k=32)
    assert (given.block_q, given.block_k, given.source) == (64, 32, "given")
    assert tile_choice(100, 4096).source == "default"


def test_a_cache_file_is_written_only_when_asked_and_read_back(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = tile_choice(320, 320, heads=4, d_head=32)
    assert first.source == "measured" and list(tmp_path.iterdir()) == []
    choice_module.forget()
    cache = tmp_path / "tiles.json"
    monkeypatch.setenv(CACHE_ENV, str(cache))
    measured = tile_choice(320, 320, heads=4, d_head=32)
    data = json.loads(cache.read_text())
    assert data["version"] == 2 and [entry["tile"] for entry in data["choices"].values()] == [[measured.block_q] * 2]
    choice_module.forget()
    monkeypatch.setattr(choice_module, "_measure", lambda *a: pytest.fail("the cache file should answer"))
    again = tile_choice(320, 320, heads=4, d_head=32)
    assert again.source == "cache file" and again.block_q == measured.block_q and str(cache) in again.reason


@pytest.mark.parametrize("body", ["not json", '{"version": 2, "choices": {"x|forward|": {"tile": [77, 77]}}}', "[]",
                                  '{"version": 1, "choices": {"x": {"tile": 512}}}',
                                  '{"version": 2, "choices": {"x|backward|": {"tile": [128, 512], "timings": {"128": 1}}}}'])
def test_a_corrupt_cache_file_is_ignored_with_one_warning_line(tmp_path, monkeypatch, capsys, body):
    cache = tmp_path / "tiles.json"
    cache.write_text(body)
    monkeypatch.setenv(CACHE_ENV, str(cache))
    found = tile_choice(320, 320, heads=4, d_head=32)
    err = capsys.readouterr().err
    assert found.source == "measured"
    assert err.count("\n") == 1 and err.startswith(f"selfattn: warning: ignoring the tile cache {cache}")
    assert json.loads(cache.read_text())["version"] == 2  # rewritten with what was measured


def backward_spy(monkeypatch) -> list:
    seen = []
    real = flash.flash_backward
    monkeypatch.setattr(flash, "flash_backward", lambda *a, **kw: seen.append((a[8], a[9])) or real(*a, **kw))
    return seen


def grads(q, k, v, **blocks):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = sa.flash_attention(*leaves, enable_gqa=True, **blocks)
    out.backward(torch.linspace(-1, 1, out.numel()).reshape(out.shape))
    return [out.detach()] + [t.grad for t in leaves]


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_the_backward_fits_its_own_tiles_and_keeps_the_results(monkeypatch, kv_heads):
    q, k, v = inputs(kv_heads=kv_heads)
    q = q * 3  # far from uniform attention
    seen = backward_spy(monkeypatch)
    auto = grads(q, k, v)
    chosen = tile_choice(320, 320, heads=4, d_head=32, group=4 // kv_heads, backward=True)
    assert chosen.source == "measured" and set(chosen.timings) == set(choice_module.BACKWARD_CANDIDATES)
    assert "backward" in chosen.reason
    default = choice_module.BACKWARD_DEFAULT
    fastest = min(chosen.timings, key=chosen.timings.get)
    margin = chosen.timings[fastest] <= (1 - choice_module.MARGIN) * chosen.timings[default]
    assert (chosen.block_q, chosen.block_k) == (fastest if margin else default)
    assert seen == [(chosen.block_q, chosen.block_k)]
    # The forward's choice is its own, kept under another key.
    assert tile_choice(320, 320, heads=4, d_head=32, group=4 // kv_heads).timings.keys() == {(s, s) for s in CANDIDATES}
    fixed = grads(q, k, v, block_q=64, block_k=96)
    assert seen[-1] == (64, 96)
    for ours, other in zip(auto, fixed):
        torch.testing.assert_close(ours, other, atol=2e-6, rtol=1e-5)  # float32 reordering only
    ref = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = torch.nn.functional.scaled_dot_product_attention(*ref, enable_gqa=True)
    out.backward(torch.linspace(-1, 1, out.numel()).reshape(out.shape))
    for ours, theirs in zip(auto, [out.detach()] + [t.grad for t in ref]):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)


def test_the_backward_keeps_given_blocks_and_short_calls_measure_nothing(monkeypatch):
    q, k, v = inputs()
    seen = backward_spy(monkeypatch)
    monkeypatch.setattr(choice_module, "_measure", lambda *a: pytest.fail("nothing should be measured"))
    grads(q, k, v, block_q=64, block_k=32)
    grads(q, k, v, block_q=256, block_k=32)
    grads(q[..., :100, :], k[..., :100, :], v[..., :100, :])
    assert seen == [(64, 32), (128, 32), choice_module.BACKWARD_DEFAULT]  # a given block_q gives at most 128 rows
    short = tile_choice(100, 4096, backward=True)
    assert (short.block_q, short.block_k, short.source) == (*choice_module.BACKWARD_DEFAULT, "default")


def test_one_given_block_is_kept_and_the_other_fitted(monkeypatch):
    q, k, v = inputs()
    seen = backward_spy(monkeypatch)
    grads(q, k, v, block_q=64)
    fitted = tile_choice(320, 320, heads=4, d_head=32, backward=True)
    assert seen == [(64, fitted.block_k)]
