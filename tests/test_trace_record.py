"""The one record (AttentionTrace): every kind fills the same steps under the same names.

The seed, the variants and a model each give an ``AttentionTrace`` whose per-layer steps
are checked against torch's own attention on the record's q, k and v (an independent
reference); the seed's walk, a variant's heads and a model's chosen head against their own.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import selfattn as sa
from selfattn.trace.record import AttentionTrace, LayerSteps
from selfattn.trace.seed import QueryTrace

FIELDS = ("q", "k", "v", "scores", "scaled", "masked", "row_max", "exp", "exp_sum", "weights", "context")


def check_steps(steps: LayerSteps, causal_bias: torch.Tensor | None = None) -> None:
    """Shapes agree and the weights and context are torch's softmax and SDPA on the record's own q, k, v."""
    H, n = steps.weights.shape[:2]
    assert steps.q.shape[:2] == (H, n) and steps.k.shape[1] == n and len(steps.kv_head_of) == H
    k = steps.k[list(steps.kv_head_of)]  # (H, n, d_head): each query head's key/value head
    v = steps.v[list(steps.kv_head_of)]
    torch.testing.assert_close(steps.scores, steps.q @ k.transpose(-2, -1))
    torch.testing.assert_close(steps.scaled, steps.scale * steps.scores)
    mask = None if steps.allowed is None else steps.allowed
    expected = torch.softmax(steps.masked, dim=-1)
    torch.testing.assert_close(steps.weights, expected)
    reference = F.scaled_dot_product_attention(steps.q, k, v, attn_mask=mask if causal_bias is None else causal_bias,
                                               scale=steps.scale)
    torch.testing.assert_close(steps.context, reference, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(steps.exp_sum, steps.exp.sum(-1))
    assert all(getattr(steps, name) is not None for name in FIELDS)


def test_the_seed_is_one_layer_of_one_head_with_its_walk_as_a_section():
    record = sa.build_trace(sa.ExplainConfig())
    assert isinstance(record, AttentionTrace) and list(record.sections) == ["inputs", "seed"]
    assert (record.n_layers, record.n_heads, record.query.token) == (1, 1, "cat")
    check_steps(record.steps)
    x = record.embeddings
    torch.testing.assert_close(record.steps.context[0], F.scaled_dot_product_attention(x, x, x, scale=1.0))
    torch.testing.assert_close(record.steps.weights[0], torch.softmax(x @ x.T, dim=-1))  # the one head: X X^T
    walk = record.section("seed")  # the seed's walk of its query
    assert isinstance(walk, QueryTrace) and (walk.index, walk.token) == (record.query.index, record.query.token)
    torch.testing.assert_close(walk.weights, torch.softmax(x @ x[walk.index], dim=-1))
    assert record.section("flash") is None


@pytest.mark.parametrize(
    ("options", "sections"),
    [
        (dict(variant="scaled"), ["inputs", "positional", "scaling", "variant"]),
        (dict(variant="causal"), ["inputs", "positional", "projections", "scaling", "mask", "variant"]),
        (dict(variant="gqa", heads=4, kv_heads=2, positional="rope"),
         ["inputs", "positional", "projections", "scaling", "multihead", "variant"]),
        (dict(variant="multihead", positional="alibi"), ["inputs", "positional", "projections", "scaling", "multihead", "variant"]),
        (dict(variant="flash", block_size=3), ["inputs", "positional", "scaling", "flash", "variant"]),
    ],
)
def test_every_variant_fills_the_same_steps(options, sections):
    record = sa.build_trace(sa.ExplainConfig(**options))
    assert list(record.sections) == sections
    positional = record.sections["positional"]
    bias = positional.alibi_bias  # ALiBi is a bias on the scores, not a mask
    causal = record.steps.allowed
    if bias is not None:
        bias = bias if causal is None else bias.masked_fill(~causal, float("-inf"))
    check_steps(record.steps, bias)
    H, K = record.steps.q.shape[0], record.steps.k.shape[0]  # query heads, key/value heads
    assert record.steps.weights.shape == (H, 7, 7) and record.steps.v.shape[0] == K
    assert list(record.steps.kv_head_of) == [h // (H // K) for h in range(H)]  # each group of H / K reads one
    if options.get("variant") == "gqa":
        assert (H, K) == (4, 2)
    if options.get("variant") == "causal":
        assert torch.equal(causal, torch.ones(7, 7, dtype=torch.bool).tril())
    if options.get("positional") == "rope":
        steps = record.steps
        assert steps.q_plain is not None and not torch.equal(steps.q_plain, steps.q)
        k_plain = steps.k_plain[list(steps.kv_head_of)]
        torch.testing.assert_close(steps.scores_plain, steps.q_plain @ k_plain.transpose(-2, -1))
        assert not torch.allclose(steps.scores_plain, steps.scores)  # the turn changed the scores
    else:
        assert record.steps.scores_plain is None


def test_a_model_fills_every_layer_and_keeps_its_own_section():
    record = sa.build_trace(sa.ExplainConfig(model="tiny-induction", sentence="a b c d a b c", layer=1, head=2))
    assert list(record.sections) == ["model"] and (record.layer, record.head) == (1, 2)
    assert record.n_layers == len(record.sections["model"].infos) == 2
    for steps in record.layers:
        check_steps(steps, None if steps.allowed is None else torch.zeros(steps.allowed.shape).masked_fill(~steps.allowed, float("-inf")))
        assert torch.equal(steps.allowed, torch.ones_like(steps.allowed).tril())  # a decoder: causal
    # the chosen layer's steps, and its chosen head's weights are the model's own forward pass's
    assert record.steps is record.layers[1]
    model = sa.load_pretrained("tiny-induction")
    with torch.no_grad():
        own = model.run(model.tokenize("a b c d a b c"), output_attentions=True).attentions
    torch.testing.assert_close(record.steps.weights[record.head], own[1][0, 2], rtol=0, atol=1e-5)
    assert torch.equal(record.all_weights, torch.stack([steps.weights for steps in record.layers]))
    assert len(record.masks) == 2 and all(m is steps.allowed for m, steps in zip(record.masks, record.layers))
    # far from uniform: a trained head puts most of some row's weight on one key
    assert float(record.all_weights.amax()) > 0.5


def test_one_json_writer_writes_every_kind_from_its_sections(monkeypatch):
    """The JSON is the sections' keys in the record's order: a section's writer swapped for another shows up there."""
    from selfattn.render.text import json_out

    for options, first_keys in ((dict(), ["variant", "tokens", "embeddings", "embedding_source", "query"]),
                                (dict(variant="causal"), ["variant", "tokens", "embeddings", "embedding_source",
                                                          "positional", "projections", "scaling", "mask", "query"])):
        data = json_out.trace_to_dict(sa.build_trace(sa.ExplainConfig(**options)))
        assert list(data)[: len(first_keys)] == first_keys
    monkeypatch.setitem(json_out.SECTION_JSON, "mask", lambda record: {"mask": "written by the swapped writer"})
    data = json_out.trace_to_dict(sa.build_trace(sa.ExplainConfig(variant="causal")))
    assert data["mask"] == "written by the swapped writer"
