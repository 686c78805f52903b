"""recording(model): chosen rows of each layer's attention weights, from q, k and the kernel's lse.

The reference is transformers' own eager attention with ``output_attentions=True`` on the
same tiny random checkpoints (tests/tiny_models.py), their q and k projections scaled up
so that attention is far from uniform and a wrong scale, mask or causal row shows.
Stand-in layers (no transformers model around them) check the numbering by call order and
the causal rule of a subset of rows against softmax(scale Q K^T) written out here.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

pytest.importorskip("transformers")

from tiny_models import position_ids, reference_model, reference_tokenizer, tiny_checkpoint

import selfattn.integrations.recording as recording_module
import selfattn.integrations.transformers as adapter
from selfattn.errors import ModelError

NAME = adapter.register()
TEXTS = ["The cat sat on the warm mat and the dog lay by the door.", "Queries ask, keys answer.", "A dog lay."]
IDS = torch.tensor([[1, 5, 9, 13, 7, 21, 40, 50, 60, 11, 12]])  # q_len 11: not d_head, heads or batch
ROWS = [0, 3, -1]
SHARPEN = 2.0  # q and k times 2: scores times 4


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    made = {family: tiny_checkpoint(family, tmp_path_factory.mktemp(family)) for family in ("gpt2", "llama", "gemma3_text")}
    made["llama3"] = tiny_checkpoint("llama", tmp_path_factory.mktemp("llama3"), num_hidden_layers=3)
    return made


def sharpen(model):
    """The q and k projections times SHARPEN (GPT-2's fused c_attn: its first two thirds; q/k norms' gains)."""
    width = model.config.hidden_size
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight", "q_proj.bias", "k_proj.bias")):
                param.mul_(SHARPEN)
            elif name.endswith(("q_norm.weight", "k_norm.weight")):  # Gemma 3 normalises q and k after them
                param.mul_(SHARPEN)
            elif name.endswith("c_attn.weight"):  # (d_model, 3 d_model): q, k, v side by side
                param[:, : 2 * width].mul_(SHARPEN)
            elif name.endswith("c_attn.bias"):
                param[: 2 * width].mul_(SHARPEN)
    return model


def pair(folder, name: str = NAME):
    """(ours, eager): the same sharpened weights, selfattn's attention and transformers' eager."""
    return sharpen(reference_model(folder, name)), sharpen(reference_model(folder, "eager"))


def padded(folder) -> dict:
    tokenizer = reference_tokenizer(folder, "left")
    encoded = dict(tokenizer(TEXTS, return_tensors="pt", padding=True))
    assert not bool(encoded["attention_mask"].all()), "the texts must differ in length, or nothing is padded"
    encoded["position_ids"] = position_ids(encoded["attention_mask"])
    return encoded


def eager_weights(model, **inputs) -> tuple[torch.Tensor, ...]:
    """transformers' eager weights, (B, H, q_len, kv_len) per layer, and a check that they are far from uniform."""
    with torch.no_grad():
        weights = model(**inputs, output_attentions=True).attentions
    peaks = torch.stack([w.amax(-1).mean() for w in weights])
    assert float(peaks.min()) > 0.5, f"attention too close to uniform for the test to see errors: {peaks}"
    return weights


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_rows_match_eager_on_a_causal_forward(family, folders):
    ours, eager = pair(folders[family])
    expected = eager_weights(eager, input_ids=IDS)
    with torch.no_grad(), adapter.recording(ours) as rec:
        ours(IDS)
    assert rec.layers == len(expected) == 2
    call = rec.call(0)
    assert call.attn_mask is None and call.is_causal  # the kernel's own top-left rule, not a mask
    for layer in range(rec.layers):
        got = rec.probs(layer, ROWS)
        assert got.shape == (1, 4, 3, 11)
        assert_close(got, expected[layer][:, :, ROWS], atol=1e-5, rtol=1e-5)
        assert_close(got[..., 0, 1:], torch.zeros(1, 4, 10), atol=0, rtol=0)  # row 0 sees key 0 alone


@pytest.mark.parametrize("family", ["gpt2", "llama", "gemma3_text"])  # Gemma 3: its own scale, a sliding layer
def test_left_padded_batch_matches_eager(family, folders):
    ours, eager = pair(folders[family])
    inputs = padded(folders[family])
    expected = eager_weights(eager, **inputs)
    with torch.no_grad(), adapter.recording(ours) as rec:
        ours(**inputs)
    q_len = inputs["input_ids"].shape[1]
    for rows in (ROWS, list(range(q_len))):
        real = inputs["attention_mask"].bool()[:, rows]  # (B, rows): the rows of real tokens
        for layer in range(2):
            got = rec.probs(layer, rows)
            want = expected[layer][:, :, rows]
            assert got.shape == want.shape == (3, 4, len(rows), q_len)
            assert_close(got.transpose(1, 2)[real], want.transpose(1, 2)[real], atol=1e-5, rtol=1e-5)
            hidden = got.transpose(1, 2)[~real]  # a padding row sees no key: zeros, where eager spreads it
            assert hidden.numel() and not hidden.any()


def test_gqa_heads_subset_and_negative_rows(folders):
    ours, eager = pair(folders["llama3"])
    inputs = padded(folders["llama3"])
    expected = eager_weights(eager, **inputs)
    with torch.no_grad(), adapter.recording(ours) as rec:
        ours(**inputs)
    assert rec.layers == 3
    q_len = inputs["input_ids"].shape[1]
    heads, rows = [3, 0, 2], [-1, -4, q_len - 2]  # rows of real tokens in every text (left padding)
    assert bool(inputs["attention_mask"][:, rows].all())
    for layer in range(3):
        call = rec.call(layer)
        assert call.enable_gqa and call.query.shape[1] == 4 and call.key.shape[1] == 2
        got = rec.probs(layer, rows, heads=heads)
        assert got.shape == (3, 3, 3, q_len)
        assert_close(got, expected[layer][:, heads][:, :, rows], atol=1e-5, rtol=1e-5)
        assert_close(rec.probs(layer, rows, heads=[3]), got[:, :1], atol=0, rtol=0)


def test_nothing_quadratic_per_head_is_kept(folders):
    ours, _ = pair(folders["llama3"])
    inputs = padded(folders["llama3"])
    batch, q_len = inputs["input_ids"].shape
    with torch.no_grad(), adapter.recording(ours) as rec:
        ours(**inputs)
    calls = [rec.call(layer) for layer in range(rec.layers)]
    for call in calls:
        assert call.query.shape == (batch, 4, q_len, 16) and call.key.shape == (batch, 2, q_len, 16)
        assert call.lse.shape == (batch, 4, q_len)
        for tensor in (call.query, call.key, call.lse):
            pairs = list(zip(tensor.shape, tensor.shape[1:]))
            assert (q_len, q_len) not in pairs
        assert call.attn_mask.shape == (batch, 1, q_len, q_len)  # no heads axis, and one tensor for all layers:
    assert len({call.attn_mask.untyped_storage().data_ptr() for call in calls}) == 1


def test_generate_keeps_each_layers_latest_call(folders):
    ours, eager = pair(folders["llama"])
    with torch.no_grad(), adapter.recording(ours) as rec:
        out = ours.generate(IDS, max_new_tokens=3, do_sample=False, pad_token_id=3)
    assert out.shape == (1, 14)
    expected = eager_weights(eager, input_ids=out[:, :13])  # the last step: token 12 against the 13 cached
    for layer in range(2):
        assert rec.call(layer).query.shape[2] == 1 and rec.call(layer).key.shape[2] == 13
        assert_close(rec.probs(layer, [0]), expected[layer][:, :, [-1]], atol=1e-5, rtol=1e-5)


def test_a_custom_name_records_too(folders):
    name = adapter.register("selfattn_recorded")
    ours, eager = pair(folders["gpt2"], name)
    expected = eager_weights(eager, input_ids=IDS)
    with torch.no_grad(), adapter.recording(ours) as rec:
        ours(IDS)
    assert_close(rec.probs(1, [-1, 5]), expected[1][:, :, [-1, 5]], atol=1e-5, rtol=1e-5)


def test_weights_with_autograd_still_record_the_lse(folders):
    """output_attentions while autograd tracks the inputs takes the reference path; the record is complete."""
    ours, eager = pair(folders["llama"])
    expected = eager_weights(eager, input_ids=IDS)
    with adapter.recording(ours) as rec:
        ours(IDS, output_attentions=True).logits.sum().backward()
    for layer in range(2):
        assert not rec.call(layer).lse.requires_grad and not rec.call(layer).query.requires_grad
        assert_close(rec.probs(layer, ROWS), expected[layer][:, :, ROWS], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("output_attentions", [False, True], ids=["kernel-dropout", "reference-dropout"])
def test_dropout_records_the_weights_before_dropout(output_attentions, folders):
    ours, eager = pair(folders["llama"])
    expected = eager_weights(eager, input_ids=IDS)
    ours.train()
    for module in ours.modules():
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.5
    torch.manual_seed(0)
    with torch.no_grad(), adapter.recording(ours) as rec:
        ours(IDS, output_attentions=output_attentions)
    assert rec.layers == 2
    # Layer 0's q and k do not depend on the dropout; layer 1's come after layer 0's dropped weights.
    assert_close(rec.probs(0, ROWS), expected[0][:, :, ROWS], atol=1e-5, rtol=1e-5)
    sums = rec.probs(1, ROWS).sum(-1)
    assert_close(sums, torch.ones_like(sums), atol=1e-5, rtol=0)


def test_nested_recordings_each_get_their_models_calls(folders):
    ours, _ = pair(folders["gpt2"])
    other, _ = pair(folders["llama"])
    with torch.no_grad(), adapter.recording(ours) as outer:
        with adapter.recording(ours) as inner, adapter.recording(other) as elsewhere:
            ours(IDS)
        assert inner.layers == outer.layers == 2 and elsewhere.layers == 0
        first = inner.call(0)
        ours(IDS[:, :5])
    assert inner.call(0) is first and outer.call(0).query.shape[2] == 5  # the inner block was over
    assert recording_module.ACTIVE == []


def test_nothing_is_recorded_after_the_block_even_after_an_exception(folders):
    ours, _ = pair(folders["gpt2"])
    with pytest.raises(RuntimeError, match="inside"), torch.no_grad(), adapter.recording(ours) as rec:
        ours(IDS[:, :4])
        raise RuntimeError("inside the block")
    assert recording_module.ACTIVE == []
    with torch.no_grad():
        ours(IDS)
    assert rec.layers == 2 and rec.call(0).query.shape[2] == 4  # the forward after the block left no trace


# --- stand-in layers: numbering by call order, the causal rule on chosen rows ---


class Layer(torch.nn.Module):
    """What an attention function reads from its caller; ``layer_idx`` only when given."""

    def __init__(self, layer_idx: int | None = None):
        super().__init__()
        self.is_causal = True
        if layer_idx is not None:
            self.layer_idx = layer_idx


def causal_softmax(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(scale Q K^T) with row i seeing keys j <= i, written out.   (B, H, q, d), (B, H, kv, d) -> (B, H, q, kv)"""
    scores = scale * q @ k.transpose(-2, -1)  # (B, H, q_len, kv_len)
    hidden = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).triu(1)  # (q_len, kv_len): j > i
    return scores.masked_fill(hidden, float("-inf")).softmax(-1)


def test_layers_without_layer_idx_are_numbered_by_first_call():
    model = torch.nn.ModuleList([Layer(), Layer(), Layer()])
    g = torch.Generator().manual_seed(0)
    q, k, v = (3 * torch.randn(3, 2, 2, 7, 8, generator=g, dtype=torch.float64)).unbind(0)
    with recording_module.record(model) as rec:
        for position, module in enumerate([model[2], model[0], model[1], model[2]]):
            adapter.flash_attention_forward(module, q * (position + 1), k, v, None, scaling=0.3)
        adapter.flash_attention_forward(Layer(), q, k, v, None)  # not the model's: not recorded
    assert rec.layers == 3
    for layer, position in ((0, 3), (1, 1), (2, 2)):  # model[2] first, and its latest call is the 4th
        expected = causal_softmax(q * (position + 1), k, 0.3)
        assert_close(rec.probs(layer, ROWS), expected[:, :, ROWS], atol=1e-12, rtol=1e-10)


def test_two_modules_with_one_layer_idx_are_refused():
    model = torch.nn.ModuleList([Layer(0), Layer(0)])
    q = torch.randn(1, 1, 3, 4)
    with recording_module.record(model) as rec:
        for module in model:
            adapter.flash_attention_forward(module, q, q, q, None)
    with pytest.raises(ModelError, match="both layer 0"):
        rec.probs(0, [0])


# --- errors ---


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_recording_needs_a_model_on_selfattns_kernel(implementation, folders):
    model = reference_model(folders["gpt2"], implementation)
    with pytest.raises(ModelError, match=rf"attn_implementation=register\(\).*'{implementation}'"):
        adapter.recording(model)
    with pytest.raises(ModelError, match="attn_implementation=register"):
        adapter.recording(torch.nn.Linear(2, 2))
    assert recording_module.ACTIVE == []


@pytest.fixture(scope="module")
def recorded(folders):
    ours, _ = pair(folders["gpt2"])
    with torch.no_grad(), adapter.recording(ours) as rec:
        ours(IDS)
    return rec


def test_probs_before_any_forward(folders):
    ours, _ = pair(folders["gpt2"])
    with adapter.recording(ours) as rec, pytest.raises(ModelError, match="nothing recorded yet"):
        rec.probs(0, [0])
    assert rec.layers == 0


@pytest.mark.parametrize(("layer", "rows", "heads", "match"), [
    (2, [0], None, r"layer 2 is out of range: the recorded layers are \[0, 1\]"),
    (-1, [0], None, "layer -1 is out of range"),
    ("0", [0], None, "layer must be an int"),
    (True, [0], None, "layer must be an int"),
    (0.0, [0], None, "layer must be an int"),
    (0, [0, 11], None, "rows: 11 is out of range for 11"),
    (0, [-12], None, "rows: -12 is out of range"),
    (0, [0], [4], "heads: 4 is out of range for 4"),
    (0, [0], [-5], "heads: -5 is out of range"),
    (0, [0.5], None, "rows must be a non-empty list of ints"),
    (0, [True], None, "rows must be a non-empty list of ints"),
    (0, 3, None, "rows must be a non-empty list of ints"),
    (0, "0", None, "rows must be a non-empty list of ints"),
    (0, [], None, "rows must be a non-empty list of ints"),
    (0, None, None, "rows must be a non-empty list of ints"),
    (0, [0], [1.0], "heads must be a non-empty list of ints"),
    (0, [0], 1, "heads must be a non-empty list of ints"),
    (0, [0], ["a"], "heads must be a non-empty list of ints"),
])
def test_bad_layers_rows_and_heads_raise_model_error(layer, rows, heads, match, recorded):
    with pytest.raises(ModelError, match=match):
        recorded.probs(layer, rows, heads=heads)


def test_rows_may_be_any_sequence_of_ints(recorded):
    expected = recorded.probs(0, [0, 3, 10])
    for rows in ((0, 3, -1), torch.tensor([0, 3, -1]), [0, -8, 10]):
        assert_close(recorded.probs(0, rows), expected, atol=0, rtol=0)
    assert_close(recorded.probs(0, range(0, 11, 5)), recorded.probs(0, [0, 5, 10]), atol=0, rtol=0)
    assert_close(recorded.probs(0, [10], heads=(1, -1)), expected[:, [1, 3], 2:], atol=1e-6, rtol=1e-6)
    assert math.isclose(float(expected.sum()), 4 * 3, rel_tol=1e-6)


def test_importing_the_recording_does_not_import_transformers():
    import subprocess
    import sys

    code = "import sys, selfattn.integrations.recording; sys.exit('transformers' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
