"""all-MiniLM-L6-v2 through our attention against transformers' own BertModel (eager), offline.

Every hidden state and every attention probability must agree within 1e-5, on single
texts of many kinds and on a padded batch; padding keys get exactly zero weight; a
padded text equals its unpadded run; sentence embeddings equal mean pooling +
normalisation of the reference's output within 1e-6.
"""

from __future__ import annotations

import pytest
import torch

from minilm_reference import needs_model, ours, reference

pytestmark = needs_model

TOL = dict(rtol=0, atol=1e-5)
TEXTS = {
    "seed": "The cat sat on the warm mat",
    "accents": "Crème brûlée à la façade naïve: São Paulo, Zürich, Ångström",
    "cjk": "日本語のテキストと中文字符，还有한국어",
    "emoji": "I love 🐱 and 🔥🔥! 👩‍💻 codes",
    "long word": "antidisestablishmentarianism " + "x" * 90 + " pneumonoultramicroscopicsilicovolcanoconiosis",
    "punctuation": "Well... it's $3.50 (or 3,50 €)—isn't it?!",
}


def long_text(n_tokens: int) -> str:
    """A text of exactly n_tokens WordPiece tokens, [CLS] and [SEP] included ("the" is one token)."""
    return " ".join(["the"] * (n_tokens - 2))


def reference_run(ids: torch.Tensor, mask: torch.Tensor):
    model = reference()[0]
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, output_attentions=True, output_hidden_states=True)


@pytest.mark.parametrize("name", [*TEXTS, "256 tokens"])
def test_single_text_matches_transformers(name):
    text = TEXTS.get(name) or long_text(256)
    out = ours()(text, output_attentions=True, output_hidden_states=True)
    ref_ids = reference()[1](text, return_tensors="pt")["input_ids"]
    assert torch.equal(out.input_ids, ref_ids), "token ids differ from the reference tokenizer"
    ref = reference_run(out.input_ids, out.attention_mask)

    assert len(out.hidden_states) == 7 and len(out.attentions) == 6
    n = out.input_ids.shape[1]
    if name == "256 tokens":
        assert n == 256
    for ours_h, ref_h in zip(out.hidden_states, ref.hidden_states):
        assert ours_h.shape == (1, n, 384)
        torch.testing.assert_close(ours_h, ref_h, **TOL)
    for ours_a, ref_a in zip(out.attentions, ref.attentions):
        assert ours_a.shape == (1, 12, n, n)
        torch.testing.assert_close(ours_a, ref_a, **TOL)
    torch.testing.assert_close(out.last_hidden_state, ref.last_hidden_state, **TOL)


def test_padded_batch_matches_transformers_and_each_unpadded_run():
    texts = [TEXTS["seed"], TEXTS["accents"], "Hi", TEXTS["emoji"], long_text(40)]
    out = ours()(texts, output_attentions=True, output_hidden_states=True)
    lengths = out.lengths
    assert len(set(lengths)) > 2, "the batch must mix lengths"
    n = max(lengths)
    assert out.input_ids.shape == out.attention_mask.shape == (len(texts), n)
    assert out.attention_mask.sum(dim=1).tolist() == lengths
    slow = reference()[1]
    ref_batch = slow(texts, padding=True, return_tensors="pt")
    assert torch.equal(out.input_ids, ref_batch["input_ids"])
    assert torch.equal(out.attention_mask, ref_batch["attention_mask"])
    ref = reference_run(out.input_ids, out.attention_mask)

    for row, length in enumerate(lengths):
        # Real tokens: every layer as transformers computes it.
        for ours_h, ref_h in zip(out.hidden_states, ref.hidden_states):
            torch.testing.assert_close(ours_h[row, :length], ref_h[row, :length], **TOL)
        for ours_a, ref_a in zip(out.attentions, ref.attentions):
            torch.testing.assert_close(ours_a[row, :, :length], ref_a[row, :, :length], **TOL)
            # Padding keys get exactly zero weight, from every query row.
            assert torch.count_nonzero(ours_a[row, :, :, length:]) == 0
        # The same text alone, without padding.
        alone = ours()(texts[row], output_attentions=True, output_hidden_states=True)
        assert alone.tokens[0] == out.tokens[row]
        for batch_h, alone_h in zip(out.hidden_states, alone.hidden_states):
            torch.testing.assert_close(batch_h[row, :length], alone_h[0], **TOL)
        for batch_a, alone_a in zip(out.attentions, alone.attentions):
            torch.testing.assert_close(batch_a[row, :, :length, :length], alone_a[0], **TOL)


def test_attention_rows_are_probabilities():
    out = ours()([TEXTS["seed"], "Hi"], output_attentions=True)
    for weights in out.attentions:
        assert bool((weights >= 0).all())
        torch.testing.assert_close(weights.sum(dim=-1), torch.ones(weights.shape[:-1]), rtol=0, atol=1e-5)


def test_outputs_are_left_out_unless_asked():
    out = ours()(TEXTS["seed"])
    assert out.hidden_states is None and out.attentions is None
    assert out.last_hidden_state.shape == (1, 9, 384)
    assert out.tokens == [["[CLS]", "the", "cat", "sat", "on", "the", "warm", "mat", "[SEP]"]]
    assert out.input_ids[0].tolist() == [101, 1996, 4937, 2938, 2006, 1996, 4010, 13523, 102]


def test_sentence_embeddings_match_mean_pooling_of_the_reference():
    texts = [TEXTS["seed"], TEXTS["cjk"], "Hi", long_text(300)]
    embeddings = ours().encode(texts)
    assert embeddings.shape == (4, 384)
    batch = reference()[1](texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = reference()[0](**batch).last_hidden_state  # (batch, seq, 384)
    real = batch["attention_mask"][..., None].to(hidden.dtype)
    mean = (hidden * real).sum(dim=1) / real.sum(dim=1)
    expected = mean / mean.norm(dim=-1, keepdim=True)
    torch.testing.assert_close(embeddings, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(embeddings.norm(dim=-1), torch.ones(4), rtol=0, atol=1e-6)
    torch.testing.assert_close(ours().encode(texts, normalize=False), mean, rtol=0, atol=1e-5)
    # Batching does not change a text's embedding.
    torch.testing.assert_close(ours().encode(texts, batch_size=1), embeddings, rtol=0, atol=1e-6)


def test_similar_sentences_are_closer_than_unrelated_ones():
    a, b, c = ours().encode(["A cat sits on a mat.", "A kitten rests on a rug.", "Interest rates rose again."])
    assert float(a @ b) > float(a @ c) + 0.2


def test_gradients_flow_when_asked_for():
    model = ours()
    model.requires_grad_(True)
    try:
        out = model("The cat sat", output_attentions=False)
        out.last_hidden_state.sum().backward()
        grad = model.encoder.layers[0].attention.w_q.weight.grad
        assert grad is not None and bool(grad.abs().sum() > 0)
    finally:
        model.zero_grad(set_to_none=True)
        model.requires_grad_(False)
