"""transformers' own models, run with attn_implementation="selfattn", against its sdpa and eager paths.

Each family's tiny random checkpoint (tests/tiny_models.py: GQA, multi-query, sliding
windows, qkv biases, q/k norms, Gemma 3's own score scale and its sliding and full layers,
BERT's bidirectional attention) is loaded twice or three times from the same folder, so
the only difference is the attention function (Gemma 3's layers pass it their scaling and
sliding_window: the scaling is the kernel's scale, the window is in the mask). The adapter's calls to
our kernel are counted, so a test fails if transformers quietly took another path.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
from torch.testing import assert_close

pytest.importorskip("transformers")

from tiny_models import DECODERS, FAMILIES, position_ids, reference_model, reference_tokenizer, tiny_checkpoint

import selfattn.integrations.transformers as adapter
from selfattn.errors import ModelError

TEXTS = [
    "The cat sat on the warm mat and the dog lay by the door.",
    "Queries ask, keys answer.",
    "A dog lay by the door.",
]
NAME = adapter.register()


class Calls:
    """How often the adapter reached the flash kernel and the reference attention."""

    def __init__(self):
        self.flash = 0
        self.reference = 0


@pytest.fixture
def calls(monkeypatch):
    counted = Calls()
    flash, reference = adapter.flash_attention, adapter.attention_forward

    def counting_flash(*args, **kwargs):
        counted.flash += 1
        return flash(*args, **kwargs)

    def counting_reference(*args, **kwargs):
        counted.reference += 1
        return reference(*args, **kwargs)

    monkeypatch.setattr(adapter, "flash_attention", counting_flash)
    monkeypatch.setattr(adapter, "attention_forward", counting_reference)
    return counted


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return {family: tiny_checkpoint(family, tmp_path_factory.mktemp(family)) for family in FAMILIES}


def models(folder, *implementations):
    return [reference_model(folder, implementation) for implementation in implementations]


def layers(model) -> int:
    return model.config.num_hidden_layers


def batch(family: str, folder):
    """The padded batch (left padding and real positions for decoders, right padding for BERT)."""
    tokenizer = reference_tokenizer(folder, "right" if family == "bert" else "left")
    encoded = dict(tokenizer(TEXTS, return_tensors="pt", padding=True))
    assert not bool(encoded["attention_mask"].all()), "the texts must differ in length, or nothing is padded"
    if family != "bert":
        encoded["position_ids"] = position_ids(encoded["attention_mask"])
    return encoded


def result(family: str, output) -> torch.Tensor:
    return output.last_hidden_state if family == "bert" else output.logits


def real(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The entries at real tokens: (B, seq, ...) -> (n_real, ...)."""
    return values[mask.bool()]


@contextmanager
def no_dropout(model):
    """Train mode with every dropout at 0, so gradients are deterministic and comparable."""
    model.train()
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0
    yield model
    model.eval()


@pytest.mark.parametrize("family", FAMILIES)
def test_padded_batch_matches_sdpa(family, folders, calls):
    ours, sdpa = models(folders[family], NAME, "sdpa")
    inputs = batch(family, folders[family])
    with torch.no_grad():
        expected, got = result(family, sdpa(**inputs)), result(family, ours(**inputs))
    assert calls.flash == layers(ours) and calls.reference == 0
    mask = inputs["attention_mask"]
    assert_close(real(got, mask), real(expected, mask), atol=1e-4, rtol=1e-5)
    assert torch.isfinite(got).all()  # padding rows too: they see no key and get zeros


@pytest.mark.parametrize("family", FAMILIES)
def test_attention_weights_match_eager(family, folders, calls):
    ours, eager = models(folders[family], NAME, "eager")
    inputs = batch(family, folders[family])
    with torch.no_grad():
        expected = eager(**inputs, output_attentions=True).attentions
        got = ours(**inputs, output_attentions=True).attentions
    assert calls.flash == layers(ours) and calls.reference == 0  # the weights came from the kernel's lse
    assert len(got) == len(expected) == layers(ours)
    real_rows = inputs["attention_mask"].bool()[:, None, :, None]  # (B, 1, q, 1)
    real_cols = inputs["attention_mask"].bool()[:, None, None, :]  # (B, 1, 1, kv)
    keep = (real_rows & real_cols).expand_as(expected[0])
    for layer_got, layer_expected in zip(got, expected):
        assert_close(layer_got[keep], layer_expected[keep], atol=1e-5, rtol=1e-5)
        rows = layer_got.sum(-1)[real_rows.squeeze(-1).expand_as(layer_got[..., 0])]
        assert_close(rows, torch.ones_like(rows), atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", DECODERS)
def test_weights_with_gradients_match_eager(family, folders, calls):
    """output_attentions while autograd tracks the inputs: the weights' gradients are eager's too."""
    ours, eager = models(folders[family], NAME, "eager")
    inputs = batch(family, folders[family])
    mask = inputs["attention_mask"].bool()
    keep = (mask[:, None, :, None] & mask[:, None, None, :]).expand(-1, 4, -1, -1)
    grads = []
    for model in (eager, ours):
        weights = model(**inputs, output_attentions=True).attentions[-1]
        torch.manual_seed(1)
        (weights[keep] * torch.randn(int(keep.sum()))).sum().backward()
        projection = ("q_proj.weight", "c_attn.weight")
        grads.append(next(p.grad for n, p in model.named_parameters() if n.endswith(projection)))
    assert calls.reference == layers(ours)
    assert_close(grads[1], grads[0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", DECODERS)
@pytest.mark.parametrize(("padded", "new"), [(True, 1), (False, 1), (False, 2)], ids=["padded-1", "text-1", "text-2"])
def test_cached_continuation_matches_sdpa(family, padded, new, folders, calls):
    """Prompt with use_cache, then new tokens against the cache: q_len < kv_len. One text has no
    padding, so its prompt and its 1-token step come without a mask (the causal rule decides);
    2 new tokens against the cache need one."""
    ours, sdpa = models(folders[family], NAME, "sdpa")
    if padded:
        inputs = batch(family, folders[family])
    else:
        inputs = dict(reference_tokenizer(folders[family])(TEXTS[:1], return_tensors="pt"))
    steps = []
    for model in (sdpa, ours):
        with torch.no_grad():
            prompt = model(**inputs, use_cache=True)
            next_ids = torch.tensor([[5, 17][:new]] * len(inputs["input_ids"]))
            mask = torch.cat([inputs["attention_mask"], torch.ones_like(next_ids)], dim=1)
            positions = position_ids(mask)[:, -new:]
            step = model(input_ids=next_ids, attention_mask=mask, position_ids=positions, cache=prompt.cache)
        steps.append((prompt.logits, step.logits))
    assert calls.flash == 2 * layers(ours)
    assert_close(steps[1][1], steps[0][1], atol=1e-4, rtol=1e-5)
    prompt_mask = inputs["attention_mask"]
    assert_close(real(steps[1][0], prompt_mask), real(steps[0][0], prompt_mask), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("family", DECODERS)
def test_greedy_generation_matches_sdpa(family, folders, calls):
    ours, sdpa = models(folders[family], NAME, "sdpa")
    tokenizer = reference_tokenizer(folders[family])
    inputs = dict(tokenizer(TEXTS, return_tensors="pt", padding=True))
    settings = {"max_new_tokens": 20, "do_sample": False, "pad_token_id": tokenizer.pad_token_id}
    with torch.no_grad():
        expected = sdpa.generate(**inputs, **settings)
        got = ours.generate(**inputs, **settings)
    assert calls.flash >= 20 * layers(ours)
    assert got.shape == expected.shape
    assert got.tolist() == expected.tolist()


@pytest.mark.parametrize("family", FAMILIES)
def test_gradients_match_sdpa(family, folders, calls):
    """The projections' gradients through our kernel, held to transformers' own sdpa error.

    Both float32 runs are compared with sdpa run in float64 on the same weights. How far
    float32 lands from float64 depends on the CPU's kernels, so ours is bounded by sdpa's
    own error on the same input, not by a fixed tolerance: the whole gradient's error
    (its norm) within 2x sdpa's, and its largest single entry within 5x (one entry's
    error is noisy: 0.5-2.4x sdpa's across these checkpoints on one Intel CPU, where the
    norms stay within 0.7-1.4x).
    """
    ours, sdpa, exact = models(folders[family], NAME, "sdpa", "sdpa")
    exact.double()
    inputs = batch(family, folders[family])
    mask = inputs["attention_mask"]
    picked = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "c_attn.weight", "query.weight", "key.weight")
    grads = []
    for model in (sdpa, ours, exact):
        with no_dropout(model):
            values = real(result(family, model(**inputs)), mask)
            torch.manual_seed(2)
            (values * torch.randn(values.shape).to(values.dtype)).sum().backward()  # every position counts differently
        grads.append({n: p.grad for n, p in model.named_parameters() if n.endswith(picked)})
    assert calls.flash == layers(ours) and calls.reference == 0
    assert grads[0].keys() == grads[1].keys() == grads[2].keys() and len(grads[0]) >= layers(ours)
    for name in grads[0]:
        theirs, mine = (grads[i][name].double() - grads[2][name] for i in (0, 1))
        floor = 1e-7 * float(grads[2][name].abs().max())  # for an error that is exactly zero
        assert mine.norm() <= 2 * theirs.norm() + floor, f"{name}: |error| {mine.norm():.3g} > 2 x sdpa's {theirs.norm():.3g}"
        assert mine.abs().max() <= 5 * theirs.abs().max() + floor, f"{name}: max error {mine.abs().max():.3g} > 5 x sdpa's"


def test_register_twice_returns_the_name():
    assert adapter.register() == NAME == "selfattn"
    assert adapter.register("selfattn_second") == "selfattn_second"
    assert adapter.register("selfattn_second") == "selfattn_second"


BAD_NAMES = ["", "  ", None, 3, "my flash", "flash_selfattn", "org/kernel", "paged|x", "sdpa", "eager"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_names_raise_model_error(name):
    with pytest.raises(ModelError):
        adapter.register(name)


def test_missing_transformers_says_what_to_install(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "transformers", None)  # import transformers now fails
    with pytest.raises(ModelError, match=r"selfattn\[transformers\]"):
        adapter.register()


class Layer(torch.nn.Module):
    """A stand-in attention layer: what attention functions read from their caller."""

    def __init__(self, causal: bool, groups: int):
        super().__init__()
        self.is_causal = causal
        self.num_key_value_groups = groups


def qkv(heads: int, kv_heads: int, q_len: int, kv_len: int, batch: int = 2, d: int = 8):
    g = torch.Generator().manual_seed(q_len * 100 + kv_len)
    q = torch.randn(batch, q_len, heads, d, generator=g, dtype=torch.float64).transpose(1, 2)  # a view, as layers pass
    k, v = torch.randn(2, batch, kv_heads, kv_len, d, generator=g, dtype=torch.float64).unbind(0)
    return q, k, v


def hiding_mask(q_len: int, kv_len: int) -> torch.Tensor:
    """(2, 1, q_len, kv_len) bool: random keys hidden, and query 0 of the first text sees none."""
    g = torch.Generator().manual_seed(7)
    mask = torch.rand(2, 1, q_len, kv_len, generator=g) > 0.3
    mask[..., 0] = True
    mask[0, :, 0] = False
    return mask


CASES = {  # (causal layer, heads, kv heads, q_len, kv_len, mask kind, extra keyword arguments)
    "causal-prefill-gqa": (True, 4, 2, 7, 7, None, {}),
    "decode-no-mask": (True, 4, 1, 1, 9, None, {}),
    "prefill-into-empty-static-cache": (True, 4, 4, 5, 9, None, {}),
    "bidirectional": (False, 3, 3, 6, 6, None, {}),
    "is_causal-kwarg-overrides-layer": (True, 2, 2, 6, 6, None, {"is_causal": False}),
    "bool-mask-hidden-row": (True, 4, 2, 5, 8, "bool", {}),
    "float-mask-finfo-min": (True, 4, 2, 5, 8, "float", {}),
    "position-bias-causal": (True, 2, 2, 6, 6, None, {"position_bias": True}),
    "position-bias-bool-mask": (False, 2, 2, 5, 8, "bool", {"position_bias": True}),
}


@pytest.mark.parametrize("case", CASES)
def test_function_matches_transformers_sdpa_function(case, calls):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    causal, heads, kv_heads, q_len, kv_len, mask_kind, extra = CASES[case]
    q, k, v = qkv(heads, kv_heads, q_len, kv_len)
    mask = None if mask_kind is None else hiding_mask(q_len, kv_len)
    if mask_kind == "float":
        mask = torch.zeros(mask.shape, dtype=q.dtype).masked_fill(~mask, torch.finfo(q.dtype).min)
    if extra.get("position_bias"):
        g = torch.Generator().manual_seed(3)
        extra = dict(extra, position_bias=torch.randn(1, heads, q_len, kv_len, dtype=q.dtype, generator=g))
    layer = Layer(causal, heads // kv_heads)
    expected, _ = sdpa_attention_forward(layer, q, k, v, mask, dropout=0.0, scaling=0.3, **extra)
    got, weights = adapter.flash_attention_forward(layer, q, k, v, mask, scaling=0.3, dropout=0.0, **extra)
    assert calls.flash == 1 and weights is None
    assert got.shape == (2, q_len, heads, 8) and got.is_contiguous()
    assert torch.isfinite(got).all()
    if mask_kind == "bool":  # the row that sees nothing: zeros here (torch's result for it may differ)
        assert_close(got[0, 0], torch.zeros_like(got[0, 0]), atol=0, rtol=0)
        got, expected = got[:, 1:], expected[:, 1:]
    assert_close(got, expected, atol=1e-12, rtol=1e-10)


def test_dropout_in_training_runs_in_the_kernel(calls):
    q, k, v = qkv(4, 2, 6, 6)
    layer = Layer(True, 2)
    plain, _ = adapter.flash_attention_forward(layer, q, k, v, None, dropout=0.0)
    assert calls.flash == 1
    layer.train()
    torch.manual_seed(0)
    dropped, _ = adapter.flash_attention_forward(layer, q, k, v, None, dropout=0.5)
    assert calls.reference == 0 and calls.flash == 2
    assert torch.isfinite(dropped).all() and not torch.allclose(dropped, plain)
    torch.manual_seed(0)  # the same seed draws the same pattern
    again, _ = adapter.flash_attention_forward(layer, q, k, v, None, dropout=0.5)
    assert_close(again, dropped, atol=0, rtol=0)
    layer.eval()  # as eager attention: dropout only while training
    evaluated, _ = adapter.flash_attention_forward(layer, q, k, v, None, dropout=0.5)
    assert calls.flash == 4
    assert_close(evaluated, plain, atol=0, rtol=0)


def test_softcap_is_refused():
    q, k, v = qkv(2, 2, 3, 3)
    with pytest.raises(ModelError, match="softcap"):
        adapter.flash_attention_forward(Layer(True, 1), q, k, v, None, softcap=30.0)


def test_importing_selfattn_does_not_import_transformers():
    import subprocess
    import sys

    code = "import sys, selfattn, selfattn.integrations; sys.exit('transformers' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
