"""MultiHeadAttention looks its path up in one registry, and a declined path says why.

Which path ran is seen by spying on the registry's entries; what each path computes is
checked against torch elsewhere (test_multihead.py, test_packed_attention.py, test_flash.py).
Here: the order, the reasons, and that forward runs what path_for names.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from selfattn.attention import paths
from selfattn.attention.kv_cache import KVCache
from selfattn.attention.modules import MultiHeadAttention


@pytest.fixture
def ran(monkeypatch):
    """The names of the paths that ran, in order."""
    names = []
    for name, path in list(paths.PATHS.items()):
        def spy(module, call, _run=path.run, _name=name):
            names.append(_name)
            return _run(module, call)
        monkeypatch.setitem(paths.PATHS, name, path._replace(run=spy))
    return names


def module(**kwargs) -> MultiHeadAttention:
    torch.manual_seed(0)
    return MultiHeadAttention(8, 2, **kwargs).double()


X = torch.randn(2, 6, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


def test_the_order_is_the_chosen_kernel_then_packed_then_reference():
    assert paths.path_order("reference") == ["packed", "reference"]
    assert paths.path_order("flash") == ["flash", "packed", "reference"]
    assert set(paths.PATHS) >= {"reference", "flash", "packed"}


def test_training_self_attention_takes_the_packed_path(ran):
    mha = module()
    x = X.clone().requires_grad_()
    assert mha.path_for(x, is_causal=True) == ("packed", {})
    mha(x, is_causal=True)
    assert ran == ["packed"]


@pytest.mark.parametrize(
    ("kwargs", "call", "reason"),
    [
        ({}, {"need_weights": True}, "asks for the weights"),
        ({}, {"attn_mask": torch.ones(6, 6, dtype=torch.bool)}, "has a mask"),
        ({}, {"cache": KVCache()}, "KV cache"),
        ({"positional": "rope"}, {}, "positional setting is 'rope'"),
        ({"n_kv_heads": 1}, {}, "grouped key/value heads"),
        ({"dropout": 0.5}, {}, "dropout is on"),
        ({}, {"key": X[:, :3]}, "cross-attention"),
    ],
)
def test_packed_declines_and_says_why(ran, kwargs, call, reason):
    mha = module(**kwargs)
    x = X.clone().requires_grad_()
    choice = mha.path_for(x, **call)
    assert choice.name == "reference" and reason in choice.declined["packed"]
    mha(x, **call)
    assert ran == ["reference"]


def test_without_gradients_the_packed_path_declines(ran):
    with torch.no_grad():
        choice = module().path_for(X)
        module()(X)
    assert choice.name == "reference" and "no gradient" in choice.declined["packed"]
    assert ran == ["reference"]


def test_flash_takes_long_calls_and_declines_short_ones_and_weights(ran):
    mha = module(attn_impl="flash")
    mha.config = dataclasses.replace(mha.config, flash_min_queries=4)
    with torch.no_grad():
        assert mha.path_for(X).name == "flash"
        out = mha(X, is_causal=True)
        short = mha.path_for(X[:, :2])
        weights = mha.path_for(X, need_weights=True)
    assert ran == ["flash"]
    assert short.name == "reference" and "fewer than flash_min_queries (4)" in short.declined["flash"]
    assert weights.name == "reference" and "need_weights" in weights.declined["flash"]
    # The flash path is the same attention: against torch's SDPA on the module's own projections.
    q, k, v = (lin(X).view(2, 6, 2, 4).transpose(1, 2) for lin in (mha.w_q, mha.w_k, mha.w_v))
    expected = mha.w_o(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2))
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=1e-12)


def test_a_path_swapped_in_the_registry_is_the_one_that_runs(monkeypatch, ran):
    monkeypatch.setitem(paths.PATHS, "packed", paths.PATHS["packed"]._replace(declines=lambda m, c: "switched off"))
    mha = module()
    x = X.clone().requires_grad_()
    assert mha.path_for(x) == ("reference", {"packed": "switched off"})
    mha(x)
    assert ran == ["reference"]
