"""Decoders (and BERT) from a Hugging Face folder, against transformers' own models on the same files.

Each family's tiny checkpoint is random with std 0.2 (tests/tiny_models.py), so its
attention is far from uniform and a wrong scale, mask, window or rotation shows.
The reference is transformers with eager attention, positions from the attention mask.
"""

from __future__ import annotations

import pytest
import torch

from tiny_models import DECODERS, FAMILIES, position_ids, reference_model, reference_tokenizer, tiny_checkpoint

transformers = pytest.importorskip("transformers")

import selfattn as sa  # noqa: E402

TEXTS = ["The cat sat on the warm mat.", "A dog", "Queries ask, keys answer, values are what gets mixed."]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    return {family: tiny_checkpoint(family, root / family) for family in FAMILIES}


@pytest.fixture(scope="module")
def models(checkpoints):
    return {family: sa.load_pretrained(folder) for family, folder in checkpoints.items()}


def _real(mask: torch.Tensor):
    """Masks over real tokens: (batch, seq) and (batch, 1, seq, seq) for weights."""
    m = mask.bool()
    return m, m[:, None, :, None] & m[:, None, None, :]


def _compare(ours, theirs, mask):
    tokens, pairs = _real(mask)
    torch.testing.assert_close(ours.logits[tokens], theirs.logits[tokens], atol=1e-4, rtol=1e-4)
    assert len(ours.hidden_states) == len(theirs.hidden_states)
    for a, b in zip(ours.hidden_states, theirs.hidden_states):
        torch.testing.assert_close(a[tokens], b[tokens], atol=1e-4, rtol=1e-4)
    assert len(ours.attentions) == len(theirs.attentions)
    for a, b in zip(ours.attentions, theirs.attentions):
        torch.testing.assert_close(a.masked_select(pairs), b.masked_select(pairs), atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", DECODERS)
@pytest.mark.parametrize("side", ["left", "right"])
def test_logits_hidden_states_and_weights_match_transformers(family, side, checkpoints, models):
    folder = checkpoints[family]
    reference, tokenizer = reference_model(folder), reference_tokenizer(folder, side)
    encoded = tokenizer(TEXTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        theirs = reference(
            **encoded, position_ids=position_ids(encoded["attention_mask"]), output_attentions=True, output_hidden_states=True
        )
        if side == "left":  # texts: our tokenizer pads on the left itself
            ours = models[family](TEXTS, output_attentions=True, output_hidden_states=True)
            assert torch.equal(ours.input_ids, encoded["input_ids"])
        else:
            ours = models[family](
                encoded["input_ids"], attention_mask=encoded["attention_mask"], output_attentions=True,
                output_hidden_states=True,
            )
    assert ours.logits.shape == (len(TEXTS), encoded["input_ids"].shape[1], models[family].config.vocab_size)
    _compare(ours, theirs, encoded["attention_mask"])
    # Far from uniform: otherwise the comparison above could not see a scale or mask error.
    last = int(encoded["attention_mask"][0].nonzero().max())  # the first text's last real token
    assert float(ours.attentions[-1][0, :, last].max()) > 0.5


@pytest.mark.parametrize("family", DECODERS)
def test_a_padded_row_computes_what_it_would_alone(family, models):
    model = models[family]
    with torch.no_grad():
        batch = model(TEXTS)
        alone = model(TEXTS[1])
    n = alone.logits.shape[1]
    torch.testing.assert_close(batch.logits[1, -n:], alone.logits[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", DECODERS)
def test_greedy_generation_equals_transformers_with_and_without_the_cache(family, checkpoints, models):
    folder = checkpoints[family]
    reference, tokenizer = reference_model(folder), reference_tokenizer(folder, "left")
    encoded = tokenizer(TEXTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        theirs = reference.generate(**encoded, max_new_tokens=20, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    cached = models[family].generate(TEXTS, max_new_tokens=20)
    recomputed = models[family].generate(TEXTS, max_new_tokens=20, use_cache=False)
    eos = set(models[family].config.eos_ids)
    for row in range(len(TEXTS)):
        expected = []
        for token in theirs[row, encoded["input_ids"].shape[1]:].tolist():
            expected.append(token)
            if token in eos:
                break
        assert cached.ids[row] == expected
        assert recomputed.ids[row] == expected
        assert cached.text[row] == tokenizer.decode(expected, skip_special_tokens=True)
        assert cached.prompt_ids[row] == tokenizer(TEXTS[row])["input_ids"]
        assert len(cached.top[row]) == len(expected)
        assert cached.top[row][0][0].id == expected[0]  # greedy: the most likely token is the one chosen


@pytest.mark.parametrize("family", DECODERS)
def test_a_cached_decode_equals_a_full_recompute(family, models):
    model = models[family]
    encoded = model.tokenize(TEXTS)
    extra = torch.tensor([[5, 6, 7]] * len(TEXTS))  # three more tokens for every row
    caches = model.new_caches()
    with torch.no_grad():
        model.run(encoded, caches)
        mask = torch.cat([encoded.attention_mask, torch.ones_like(extra)], dim=1)
        step = model.run(sa.models.tokenizer.Encoded(encoded.tokens, extra, mask), caches, output_attentions=True)
        full = model.run(sa.models.tokenizer.Encoded(encoded.tokens, torch.cat([encoded.input_ids, extra], 1), mask),
                         output_attentions=True)
    torch.testing.assert_close(step.logits, full.logits[:, -3:], atol=1e-5, rtol=1e-5)
    for a, b in zip(step.attentions, full.attentions):  # weights <= 1: 4e-6 is about 30 float32 ulps of 1
        # (measured: 1.2e-7 on an Intel Xeon with AVX-512, 1.5e-6 on an AMD EPYC with AVX2, whose
        # matrix products over a 3-token step and a 12-token recompute round differently)
        torch.testing.assert_close(a, b[:, :, -3:], atol=4e-6, rtol=0)


def test_bert_from_a_folder_matches_transformers(checkpoints, models):
    folder = checkpoints["bert"]
    reference, tokenizer = reference_model(folder), reference_tokenizer(folder, "right")
    encoded = tokenizer(TEXTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        theirs = reference(**encoded, output_attentions=True, output_hidden_states=True)
        ours = models["bert"](TEXTS, output_attentions=True, output_hidden_states=True)
    tokens, pairs = _real(encoded["attention_mask"])
    torch.testing.assert_close(ours.last_hidden_state[tokens], theirs.last_hidden_state[tokens], atol=1e-4, rtol=1e-4)
    for a, b in zip(ours.attentions, theirs.attentions):
        torch.testing.assert_close(a.masked_select(pairs), b.masked_select(pairs), atol=1e-5, rtol=0)
    assert ours.logits is None
    with pytest.raises(sa.ModelError, match="encoder"):
        models["bert"].generate("The cat")


def test_sampling_is_seeded_and_its_filters_match_transformers(models):
    model = models["llama"]
    a = model.generate("The cat", max_new_tokens=8, temperature=0.8, top_k=20, top_p=0.9, seed=3)
    b = model.generate("The cat", max_new_tokens=8, temperature=0.8, top_k=20, top_p=0.9, seed=3)
    assert a.ids == b.ids
    greedy = model.generate("The cat", max_new_tokens=8)
    assert model.generate("The cat", max_new_tokens=8, temperature=1.0, top_k=1, seed=1).ids == greedy.ids
    assert model.generate("The cat", max_new_tokens=8, temperature=1.0, top_p=1e-6, seed=1).ids == greedy.ids
    # The kept tokens of top_k / top_p are transformers' warpers' (independent code).
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    from selfattn.models import generation

    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3
    for k, p in [(5, None), (None, 0.7), (10, 0.5)]:
        expected = logits.clone()
        if k:
            expected = TopKLogitsWarper(k)(None, expected)
        if p:
            expected = TopPLogitsWarper(p)(None, expected)
        seen = torch.zeros_like(logits, dtype=torch.bool)
        generator = torch.Generator().manual_seed(0)
        for _ in range(400):
            seen[torch.arange(4), generation.choose(logits, 1.0, k, p, generator)] = True
        assert bool((seen <= torch.isfinite(expected)).all())  # never a token the warpers drop


def test_sharded_and_pickled_weights_load_the_same_model(checkpoints, tmp_path, models):
    folder = checkpoints["qwen2"]
    reference = reference_model(folder)
    sharded = tmp_path / "sharded"
    reference.save_pretrained(sharded, max_shard_size="40KB")
    assert len(list(sharded.glob("model-*.safetensors"))) > 1
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (sharded / name).write_bytes((folder / name).read_bytes())
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    for name in ("config.json", "tokenizer.json"):
        (pickled / name).write_bytes((folder / name).read_bytes())
    torch.save(reference.state_dict(), pickled / "pytorch_model.bin")
    with torch.no_grad():
        expected = models["qwen2"](TEXTS).logits
        for other in (sharded, pickled):
            torch.testing.assert_close(sa.load_pretrained(other)(TEXTS).logits, expected, atol=0, rtol=0)


def test_a_hub_id_is_read_from_the_local_cache(checkpoints, tmp_path, monkeypatch):
    snapshot = tmp_path / "hub" / "models--tiny--gpt2" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    for item in checkpoints["gpt2"].iterdir():
        (snapshot / item.name).write_bytes(item.read_bytes())
    (tmp_path / "hub" / "models--tiny--gpt2" / "refs").mkdir()
    (tmp_path / "hub" / "models--tiny--gpt2" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    model = sa.load_pretrained("tiny/gpt2")
    assert model.name == "tiny/gpt2" and model.config.model_type == "gpt2"
    with pytest.raises(sa.ModelError, match=str(tmp_path / "hub")):
        sa.load_pretrained("tiny/absent")


def test_an_older_hub_id_without_organisation_is_read_from_the_cache(checkpoints, tmp_path, monkeypatch):
    snapshot = tmp_path / "models--gpt2" / "snapshots" / "f00d"
    snapshot.mkdir(parents=True)
    for item in checkpoints["gpt2"].iterdir():
        (snapshot / item.name).write_bytes(item.read_bytes())
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    model = sa.load_pretrained("gpt2")
    assert model.name == "gpt2" and model.config.model_type == "gpt2"
    with pytest.raises(sa.ModelError, match="unknown model 'gpt3'"):
        sa.load_pretrained("gpt3")
