"""The trace functions return the record; the old views' names still read for one release, warning.

``trace_self_attention``, ``trace_variant`` and ``trace_model`` used to return views
(``Trace``, ``VariantTrace``, ``ModelTrace``) whose names meant different things by kind:
``scores`` was X Xᵀ for the seed, scale * Q Kᵀ for a variant and the softmax's input (-inf
where masked) for a model. Each is checked here against the numbers computed by hand.
"""

from __future__ import annotations

import math
import re
import warnings

import pytest
import torch

import selfattn as sa
from selfattn.trace.old_views import OLD_NAMES, view_of
from selfattn.trace.record import AttentionTrace

SEED = "The cat sat on the warm mat"


def old(record, name):
    with pytest.warns(DeprecationWarning, match=rf"{view_of(record)}\.{name} is an old name: .* read "):
        return getattr(record, name)


def seed_record():
    return sa.build_trace(sa.ExplainConfig())


def variant_record(variant="gqa", **options):
    return sa.build_trace(sa.ExplainConfig(variant=variant, **options))


@pytest.fixture(scope="module")
def model_record():
    from selfattn.trace.model_trace import trace_model

    return trace_model("abcdefabcdef", sa.load_pretrained("tiny-induction"), layer=1, head=1)


def test_the_functions_return_the_record_and_the_old_names_are_its_aliases():
    assert sa.Trace is sa.VariantTrace is AttentionTrace
    assert type(seed_record()) is AttentionTrace and type(variant_record()) is AttentionTrace
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the record's own names never warn
        record = variant_record()
        assert record.steps.weights.shape == (4, 7, 7) and record.n_heads == 4


def test_every_old_name_reads_on_its_kind_and_says_how_to_read_it_now(model_record):
    records = {"Trace": seed_record(), "VariantTrace": variant_record(positional="rope"), "ModelTrace": model_record}
    for view, names in OLD_NAMES.items():
        record = records[view]
        assert view_of(record) == view
        for name, spelling in names.items():
            with pytest.warns(DeprecationWarning) as caught:
                getattr(record, name)
            assert str(caught[0].message).endswith("read " + re.sub(r"\br\b", "trace", spelling)), name
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        records["Trace"].nonsense


def test_the_seeds_scores_weights_and_context_are_x_xt_and_its_softmax():
    record = seed_record()
    x = record.embeddings
    torch.testing.assert_close(old(record, "scores"), x @ x.T)
    weights = torch.softmax(x @ x.T, dim=-1)
    torch.testing.assert_close(old(record, "weights"), weights)
    torch.testing.assert_close(old(record, "context"), weights @ x)
    torch.testing.assert_close(old(record, "row_sums"), torch.ones(7))
    assert old(record, "dim") == 3 and old(record, "record") is record


def test_a_variants_scores_are_scaled_and_its_keys_are_the_kv_heads():
    record = variant_record("gqa", heads=4, kv_heads=2)
    q, k = record.steps.q, record.steps.k  # (4, 7, d_k), (2, 7, d_k)
    d_k = q.shape[-1]
    by_hand = torch.einsum("hid,hjd->hij", q, k.repeat_interleave(2, dim=0)) / math.sqrt(d_k)
    torch.testing.assert_close(old(record, "scores"), by_hand)
    torch.testing.assert_close(old(record, "scores_unscaled"), by_hand * math.sqrt(d_k))
    assert old(record, "n_kv_heads") == 2 and old(record, "d_k") == d_k and old(record, "kv_head_of") == [0, 0, 1, 1]
    assert old(record, "variant") == "gqa" and old(record, "projected") is True and old(record, "scaled") is True
    assert old(variant_record("flash"), "scaled") is False


def test_a_models_scores_are_the_softmax_input_of_its_head_and_k_is_the_head_it_reads(model_record):
    record, h = model_record, 1
    steps = record.steps
    kv = steps.kv_head_of[h]
    torch.testing.assert_close(old(record, "q"), steps.q[h])
    torch.testing.assert_close(old(record, "k"), steps.k[kv])
    scores = old(record, "scores")
    assert torch.isinf(scores).any()  # the causal mask: -inf above the diagonal
    torch.testing.assert_close(torch.softmax(scores, dim=-1), old(record, "weights"))
    torch.testing.assert_close(old(record, "scores_unscaled") * steps.scale, steps.scaled[h])
    assert old(record, "attention") == record.sections["model"].infos[1] and old(record, "attention").causal
    assert old(record, "d_head") == steps.q.shape[-1] and old(record, "query_token") == record.query.token
    assert old(record, "is_special")(0) == (record.tokens[0] in record.sections["model"].special_tokens)
