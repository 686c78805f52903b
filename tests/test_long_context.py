"""Long texts: a model's trace keeps one layer's n x n steps, and every other layer's rows exact.

Past ``FULL_TRACE_CELLS`` (layers x heads x n x n) ``trace_model`` keeps the chosen layer's
whole steps and every other layer as ``LayerRows``: q, k, v, each head's output and the
softmax's log-sum-exp from the tiled kernel. Checked here: the weights those rows give
equal transformers' eager attention (tiny random checkpoints of every family: windows,
grouped heads, an encoder) and SmolLM2's own forward pass with its weights; the chosen
layer equals the whole trace's; and SmolLM2's walkthrough of about 2,000 tokens holds one
layer's matrices and stays within a few GB (every layer's steps would take about 40 GB).
"""

from __future__ import annotations

import dataclasses
import io

import pytest
import torch

import selfattn as sa
from selfattn.errors import ModelError
from selfattn.models import files
from selfattn.peak_memory import PeakMemory
from selfattn.trace.model_trace import trace_model
from selfattn.trace.model_layers import FULL_TRACE_CELLS
from selfattn.trace.record import LayerRows, LayerSteps
from tiny_models import DECODERS, reference_model, tiny_checkpoint

TOL = dict(rtol=0, atol=1e-5)  # weights in float32 on both sides
# The chosen layer's steps in the two kinds of trace: their hidden states come from forward passes on
# different attention paths (with and without the weights), a few float32 roundings apart (~2e-6),
# which q . k of 6-long vectors grows to ~5e-5.
CLOSE = dict(rtol=1e-5, atol=1e-4)
TINY_TEXT = "Queries ask, keys answer, values are what gets mixed. The cat sat on the warm mat."
WHOLE = ("scores", "scaled", "masked", "exp", "weights", "scores_plain")  # a layer's (H, n, n) steps


def square_tensors(record) -> dict[int, list[str]]:
    """Layer -> the names of its float tensors with n x n in their last two axes."""
    n = len(record.tokens)
    found = {}
    for l, steps in enumerate(record.layers):
        for f in dataclasses.fields(steps):
            value = getattr(steps, f.name)
            if isinstance(value, torch.Tensor) and value.is_floating_point() and tuple(value.shape[-2:]) == (n, n):
                found.setdefault(l, []).append(f.name)
    return found


def held_bytes(record) -> int:
    """Bytes of the distinct tensor storages the record's layers and hidden states hold."""
    tensors = [getattr(s, f.name) for s in record.layers for f in dataclasses.fields(s)]
    tensors += list(record.sections["model"].hidden_states)
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors if isinstance(t, torch.Tensor)}
    return sum(storages.values())


# ---- tiny checkpoints of every family, against transformers --------------------------------


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    pytest.importorskip("transformers", reason="the tiny checkpoints are made and read back with transformers")
    root = tmp_path_factory.mktemp("long")
    return {family: tiny_checkpoint(family, root / family) for family in (*DECODERS, "bert")}


@pytest.mark.parametrize("family", [*DECODERS, "bert"])
def test_the_other_layers_rows_give_transformers_weights(folders, family):
    model = sa.load_pretrained(str(folders[family]))
    record = trace_model(TINY_TEXT, model, layer=1, head=3, query=-1, every_layer=False)
    whole = trace_model(TINY_TEXT, model, layer=1, head=3, query=-1, every_layer=True)
    n = len(record.tokens)
    assert [type(s) for s in record.layers] == [LayerRows, LayerSteps]
    assert square_tensors(record) == {1: [name for name in WHOLE if getattr(record.layers[1], name) is not None]}
    with torch.no_grad():
        theirs = reference_model(folders[family])(input_ids=torch.tensor([record.sections["model"].input_ids]), output_attentions=True)
    for layer in range(2):
        torch.testing.assert_close(record.layers[layer].weights, theirs.attentions[layer][0], **TOL)
    kept = record.layers[0]
    torch.testing.assert_close(kept.weight_rows([n - 1, 0, 5]), theirs.attentions[0][0][:, [n - 1, 0, 5]], **TOL)
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(record.masks, whole.masks))
    torch.testing.assert_close(torch.logsumexp(whole.layers[0].masked, dim=-1), kept.lse, **TOL)
    for name in ("q", "k", "v", "context", "input", "output"):
        torch.testing.assert_close(getattr(kept, name), getattr(whole.layers[0], name), **CLOSE)
    chosen, full = record.layers[1], whole.layers[1]
    for f in dataclasses.fields(LayerSteps):
        a, b = getattr(chosen, f.name), getattr(full, f.name)
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            torch.testing.assert_close(a, b, **CLOSE, msg=lambda text, name=f.name: f"{name}: {text}")
        else:
            assert (a is None and b is None) or (torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b), f.name


# ---- SmolLM2 ---------------------------------------------------------------------------------

PARAGRAPHS = (
    "The harbour town woke slowly on winter mornings. Fishing boats rocked against the stone quay while gulls "
    "argued over scraps, and the baker on the corner pulled the first loaves from an oven that had been warm since "
    "before dawn.",
    "Mara kept the lighthouse at the end of the northern breakwater. Every evening she climbed one hundred and "
    "twelve steps, trimmed the wick, polished the great lens and wrote the weather in a ledger that her "
    "grandmother had started fifty years earlier.",
    "In the spring a surveyor arrived with maps, instruments and a plan to replace the old lamp with an electric "
    "beacon that nobody would need to tend. The council met in the school hall to argue about it, and the "
    "arguments lasted well into the night.",
    "Some said the town should welcome progress; others said a light that needed a keeper also kept a keeper, and "
    "that a person on the tower had pulled more than one crew from the rocks when the fog came in without warning.",
    "Mara listened without speaking. When the vote was taken she walked home along the shore, counting the waves "
    "the way her grandmother had taught her, and she thought about what the ledger would say in another fifty years.",
    "The surveyor stayed for a month. He measured the tower, tested the rock beneath it and, to everyone's "
    "surprise, began to spend his evenings with Mara in the lamp room, asking about the winds, the currents and the "
    "names of the ships.",
)


def story(paragraphs: int) -> str:
    """The six paragraphs over and over, each round a numbered chapter: plain English that repeats, as long texts do."""
    return "\n\n".join((f"Chapter {i // 6 + 1}. " if i % 6 == 0 else "") + PARAGRAPHS[i % 6] for i in range(paragraphs))


@pytest.fixture(scope="module")
def smollm2():
    try:
        files._distribution_file(files.MODELS["SmolLM2-135M-Instruct"])
    except ModelError as missing:
        pytest.skip(f"SmolLM2-135M-Instruct is not installed here: {missing}")
    return sa.load_pretrained("SmolLM2-135M-Instruct")


def test_smollm2_on_400_tokens_keeps_one_layer_whole_and_rows_of_its_own_weights(smollm2):
    text = story(8)
    n, layers, heads = len(smollm2.tokenize(text).tokens[0]), len(smollm2.blocks), smollm2.config.n_heads
    assert layers * heads * n * n > FULL_TRACE_CELLS  # long enough to leave the whole steps out
    record = trace_model(text, smollm2, layer=7, head=4, query=-1)
    assert [l for l, s in enumerate(record.layers) if isinstance(s, LayerSteps)] == [7]
    assert list(square_tensors(record)) == [7]
    assert len({id(m) for m in record.masks}) == 2  # the chosen layer's own, and one causal mask the rest share
    with torch.no_grad():
        own = smollm2.run(smollm2.tokenize(text), output_attentions=True).attentions  # the model's weights, every layer
    picked = [n - 1, n // 2, 0]
    for layer, steps in enumerate(record.layers):
        torch.testing.assert_close(steps.weight_rows(picked), own[layer][0][:, picked], **TOL)
    assert (record.layer, record.head) == (7, 4)
    torch.testing.assert_close(record.steps.weights[record.head], own[7][0, 4], **TOL)


def test_smollm2_walks_through_2000_tokens_in_a_few_gb(smollm2):
    from selfattn.render.text.markdown import render_markdown
    from selfattn.render.text.walk import walkthrough

    text = story(40)
    with PeakMemory() as peak:
        traced = trace_model(text, smollm2, layer=5, head=2, query=-1)
        page = render_markdown(walkthrough(traced, 4))
    n = len(traced.tokens)
    assert 1900 <= n <= 2100
    assert list(square_tensors(traced)) == [5]
    # The chosen layer's six (9, n, n) matrices 0.9 GB, the other layers' rows 0.7 GB, the hidden states 0.15 GB;
    # every layer's steps would hold 30 x 9 x n x n x 4 bytes = 4.4 GB per kind of matrix.
    assert held_bytes(traced) < 2e9
    assert f"into {n} tokens" in page and traced.query.index == n - 1
    assert abs(float(traced.steps.weights[traced.head][n - 1].sum()) - 1) < 1e-5
    if peak.bytes is None:
        pytest.skip(f"the peak memory cannot be measured here: {peak.unavailable}")
    assert peak.bytes < 3e9, f"{peak.megabytes:.0f} MB"  # 2.1 GB measured; every layer's steps: about 40 GB


def test_heads_on_a_long_text_scores_the_models_own_weights_a_layer_at_a_time(smollm2):
    """``heads`` past the budget rebuilds one layer's weights at a time; its scores are those of the
    weights the model's own forward pass returns for every layer at once."""
    from selfattn.analysis.decoder_roles import DECODER_PATTERNS, classify_decoder_heads
    from selfattn.commands.heads import decoder_run

    text = story(8)
    encoded = smollm2.tokenize(text)
    n, layers, heads = encoded.input_ids.shape[1], len(smollm2.blocks), smollm2.config.n_heads
    assert layers * heads * n * n > FULL_TRACE_CELLS  # the layer-at-a-time path
    run = decoder_run(smollm2, text, None, False)
    with torch.no_grad():
        own = smollm2.run(encoded, output_attentions=True).attentions  # every layer's weights at once
    expected = classify_decoder_heads([a[0] for a in own], encoded.input_ids[0].tolist(), first_row=0)
    names = [name.replace(" ", "_") for name in DECODER_PATTERNS] + ["entropy"]
    got = torch.tensor([[[getattr(h, k) for k in names] for h in layer] for layer in run.roles], dtype=torch.float64)
    want = torch.tensor([[[getattr(h, k) for k in names] for h in layer] for layer in expected], dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert float(want[..., :4].max()) > 0.5  # real heads: some pattern clearly holds
