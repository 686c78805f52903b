"""Knocking heads out and patching them in, against transformers with hooks on the output projection.

The reference: the same weights in transformers' own model, with a forward pre-hook on
each layer's output projection (GPT-2's c_proj, the others' o_proj, BERT's output dense)
that zeroes the head's slice of its input, replaces it by its mean, or copies it from the
clean run. Our interventions are hooks on our W_o; the two models share no code.
"""

from __future__ import annotations

import json

import pytest
import torch

import selfattn as sa
from selfattn.analysis.head_interventions import patching
from selfattn.analysis.next_token import next_token_losses
from selfattn.models.files import model_folder
from selfattn.models.tokenizer import Encoded
from tests.tiny_models import DECODERS, FAMILIES, llama2c_as_transformers, reference_model, tiny_checkpoint

transformers = pytest.importorskip("transformers")

STORIES = model_folder("stories260K") / "stories260K.bin"
INDUCTION_HEADS = [(1, 0), (1, 1), (1, 2), (1, 3)]


def output_projection(hf, layer: int):
    """transformers' module whose input is the concatenated heads of ``layer``."""
    if hf.config.model_type == "gpt2":
        return hf.transformer.h[layer].attn.c_proj
    if hf.config.model_type == "bert":
        return hf.encoder.layer[layer].attention.output.dense
    return hf.model.layers[layer].self_attn.o_proj


def head_width(hf) -> int:
    c = hf.config
    return getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads


class Reference:
    """Pre-hooks on transformers' output projections: zero, mean (running over cached steps) or patch heads."""

    def __init__(self, hf, heads, mode="zero", real=None, sources=None):
        self.hf, self.mode, self.real, self.sources = hf, mode, real, sources
        self.d = head_width(hf)
        self.by_layer = {}
        for layer, head in heads:
            self.by_layer.setdefault(layer, []).append(head)
        self.running = {}

    def __enter__(self):
        self.handles = [output_projection(self.hf, layer).register_forward_pre_hook(self._hook(layer, heads))
                        for layer, heads in self.by_layer.items()]
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()

    def _hook(self, layer, heads):
        def hook(_, args):
            x = args[0].clone()  # (batch, seq, H d)
            b, s, _ = x.shape
            v = x.view(b, s, -1, self.d)
            if self.mode == "zero":
                v[:, :, heads] = 0
            elif self.mode == "patch":
                v[:, :, heads] = self.sources[layer].view(1, s, -1, self.d)[:, :, heads]
            else:
                fresh = s > 1 or layer not in self.running
                w = (self.real.double() if (fresh and self.real is not None) else torch.ones(b, s, dtype=torch.float64))
                total = (v[:, :, heads].double() * w[..., None, None]).sum(dim=(0, 1))
                count = float(w.sum())
                if not fresh:
                    total, count = total + self.running[layer][0], count + self.running[layer][1]
                self.running[layer] = (total, count)
                v[:, :, heads] = (total / count).to(v.dtype)
            return (x,)

        return hook


@pytest.fixture(scope="module")
def induction():
    ours = sa.load_pretrained("tiny-induction")
    theirs = transformers.GPT2LMHeadModel.from_pretrained(model_folder("tiny-induction"), attn_implementation="eager")
    return ours, theirs.eval()


@pytest.fixture(scope="module")
def stories():
    return sa.load_pretrained("stories260K"), llama2c_as_transformers(STORIES)


def probe_ids(model, length=20, seed=0):
    from selfattn.analysis.probes import induction_probe_for

    return torch.tensor([induction_probe_for(model, length, seed).ids])


@pytest.mark.parametrize("which", ["induction", "stories"])
@pytest.mark.parametrize("heads", [[(1, 0)], [(0, 2), (1, 1), (1, 3)]])
@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_ablation_matches_transformers_with_a_hook_on_the_output_projection(request, which, heads, mode):
    ours, theirs = request.getfixturevalue(which)
    ids = probe_ids(ours)
    with torch.no_grad():
        plain = ours(ids).logits
        with sa.ablate(ours, heads, mode=mode):
            knocked = ours(ids).logits
        with Reference(theirs, heads, mode):
            expected = theirs(ids).logits
    torch.testing.assert_close(knocked, expected, atol=1e-4, rtol=1e-4)
    loss = next_token_losses(knocked, ids)
    torch.testing.assert_close(loss, next_token_losses(expected, ids), atol=1e-4, rtol=1e-4)
    assert (knocked - plain).abs().max() > 1e-3  # the heads mattered: the test can see a wrong slice


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_ablation_holds_in_generate_with_the_cache(stories, mode):
    ours, theirs = stories
    heads = [(1, h) for h in range(8)] + [(3, 5)]
    prompt = ours.tokenizer.encode("Once upon a time, there was a little").input_ids
    with torch.no_grad(), sa.ablate(ours, heads, mode=mode):
        made = ours.generate(prompt, max_new_tokens=12)
        uncached = ours.generate(prompt, max_new_tokens=1, use_cache=False)
    with torch.no_grad(), Reference(theirs, heads, mode):
        expected = theirs.generate(prompt, max_new_tokens=12, do_sample=False, eos_token_id=None,
                                   pad_token_id=0, attention_mask=torch.ones_like(prompt))
    assert made.ids[0] == expected[0, prompt.shape[1]:].tolist()
    assert uncached.ids[0][0] == made.ids[0][0]
    with torch.no_grad():
        plain, knocked = ours(prompt).logits, None
        with sa.ablate(ours, heads, mode=mode):
            knocked = ours(prompt).logits
    assert (plain - knocked).abs().max() > 0.1  # the knockout changes the model's next-token scores
    if mode == "zero":
        assert ours.generate(prompt, max_new_tokens=12).ids[0] != made.ids[0]  # and the story it tells


def test_mean_ablation_leaves_padding_out_of_the_mean(stories):
    ours, theirs = stories
    heads = [(1, 2), (3, 0)]
    encoded = ours.tokenize(["One day, Lily went to the park with her mom.", "Tom had a ball."])
    real = encoded.attention_mask
    with torch.no_grad():
        with sa.ablate(ours, heads, mode="mean"):
            knocked = ours(encoded.input_ids, attention_mask=real).logits
        positions = (real.cumsum(-1) - 1).clamp(min=0)
        with Reference(theirs, heads, "mean", real=real):
            expected = theirs(encoded.input_ids, attention_mask=real, position_ids=positions).logits
    keep = real.bool()
    torch.testing.assert_close(knocked[keep], expected[keep], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_can_lose_a_head(tmp_path, family):
    folder = tiny_checkpoint(family, tmp_path / family)
    ours, theirs = sa.load_pretrained(str(folder)), reference_model(folder)
    heads = [(0, 1), (1, 0)]
    ids = torch.tensor([[5, 9, 14, 3, 7, 9, 14, 2]])
    with torch.no_grad():
        with sa.ablate(ours, heads):
            got = ours(ids).logits if family in DECODERS else ours.run(
                Encoded([["t"] * ids.shape[1]], ids, torch.ones_like(ids))).last_hidden_state
        with Reference(theirs, heads):
            out = theirs(ids)
            want = out.logits if family in DECODERS else out.last_hidden_state
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("which", ["induction", "stories"])
def test_patching_matches_transformers(request, which):
    ours, theirs = request.getfixturevalue(which)
    clean = probe_ids(ours, 12, seed=1)[0].tolist()
    corrupted = list(clean)
    corrupted[-6] = clean[-8]  # the copy goes wrong a few tokens before the end
    target = clean[-1]
    got = sa.patch_heads(ours, clean, corrupted, target)

    sources, handles = {}, []
    layers = theirs.config.num_hidden_layers if hasattr(theirs.config, "num_hidden_layers") else theirs.config.n_layer
    for layer in range(layers):
        handles.append(output_projection(theirs, layer).register_forward_pre_hook(
            lambda _, args, layer=layer: sources.__setitem__(layer, args[0].detach().clone())))

    def lp(ids):
        with torch.no_grad():
            return float(theirs(torch.tensor([ids])).logits[0, -1].double().log_softmax(-1)[target])

    lp_clean = lp(clean)
    for handle in handles:
        handle.remove()
    lp_corrupted = lp(corrupted)
    expected = torch.zeros_like(got)
    for layer in range(got.shape[0]):
        for head in range(got.shape[1]):
            with Reference(theirs, [(layer, head)], "patch", sources=sources):
                expected[layer, head] = (lp(corrupted) - lp_corrupted) / (lp_clean - lp_corrupted)
    # A fraction of a log-prob difference: float32 rounding in both models is divided by it (1.5e-4 apart on
    # an AMD EPYC with AVX2, below 1e-4 on an Intel Xeon with AVX-512).
    torch.testing.assert_close(got, expected, atol=3e-4, rtol=1e-4)


def test_the_model_is_exactly_as_before_after_the_block_even_after_an_error(induction):
    ours, _ = induction
    ids = probe_ids(ours)
    state = {k: v.clone() for k, v in ours.state_dict().items()}
    before = ours(ids).logits
    with pytest.raises(RuntimeError, match="inside"):
        with sa.ablate(ours, INDUCTION_HEADS, mode="mean"):
            raise RuntimeError("inside the block")
    with sa.ablate(ours, INDUCTION_HEADS):
        pass
    assert all(torch.equal(v, state[k]) for k, v in ours.state_dict().items())
    assert not any(m._forward_pre_hooks for m in ours.modules())
    assert all(getattr(m, "points", None) is None for m in ours.modules())  # no hook left on any point
    assert torch.equal(ours(ids).logits, before)


def test_tiny_induction_proves_its_circuit(induction):
    ours, _ = induction
    from selfattn.analysis.head_interventions import ablation_losses
    from selfattn.analysis.next_token import probe_positions

    ids = probe_ids(ours)
    positions = probe_positions(20, 1)
    before, single = ablation_losses(ours, ours.tokenize(ids), positions)
    with torch.no_grad(), sa.ablate(ours, INDUCTION_HEADS):
        knocked = next_token_losses(ours(ids).logits, ids)[0, positions].mean()
    assert float(knocked) - before > 1.0  # the repeat becomes as hard as random symbols
    assert float(single[0, 0]) < 0.25 * (float(knocked) - before)  # layer 0 head 0, which the table calls mixed
    # The induction heads read the previous-token heads' output: without those, their stripe fades.
    from selfattn.analysis.decoder_roles import induction_probe_score

    with torch.no_grad():
        stripe = induction_probe_score(torch.stack(ours(ids, output_attentions=True).attentions)[:, 0], 20, 1)
        with sa.ablate(ours, [(0, 1), (0, 2), (0, 3)]):
            faded = induction_probe_score(torch.stack(ours(ids, output_attentions=True).attentions)[:, 0], 20, 1)
    assert float(stripe[1].min()) > 0.6 and float(faded[1].max()) < 0.5 * float(stripe[1].min())
    run = patching(ours, "abcdefghijklmnopabcdefghij", "abcdefghijklmnopabcdefghiw", "k")
    assert float(run.recovered[1].sum()) > 0.8 and float(run.recovered[0].abs().max()) < 0.1


@pytest.mark.parametrize("heads, message", [
    ([(2, 0)], "layer 2 is out of range: this model has 2 layers"),
    ([(1, 4)], "head 4 is out of range: layer 1 has 4 heads"),
    ([(1,)], "pair"),
    ("1.0", "list of"),
    ([(1.0, 0)], "whole numbers"),
])
def test_bad_heads_are_refused(induction, heads, message):
    ours, _ = induction
    with pytest.raises(sa.OptionError, match=message):
        with sa.ablate(ours, heads):
            pass
    assert not any(m._forward_pre_hooks for m in ours.modules())
    assert all(getattr(m, "points", None) is None for m in ours.modules())  # no hook left on any point


def test_bad_patching_input_is_refused(induction):
    ours, _ = induction
    with pytest.raises(sa.SentenceError, match="same token length"):
        sa.patch_heads(ours, "abcab", "abcabc", "c")
    with pytest.raises(sa.OptionError, match="not one"):
        sa.patch_heads(ours, "abcab", "abcac", "cd")
    with pytest.raises(sa.OptionError, match="outside the vocabulary"):
        sa.patch_heads(ours, "abcab", "abcac", 10_000)
    with pytest.raises(sa.OptionError, match="unknown ablation mode"):
        with sa.ablate(ours, [(0, 0)], mode="half"):
            pass


def test_ablate_command_json(run_cli):
    status, out, err = run_cli("ablate", "--model", "tiny-induction", "--heads", "1.0,1.1,1.2,1.3", "--probe", "induction",
                               "--format", "json")
    assert status == 0, err
    data = json.loads(out)
    assert data["heads"] == [[1, 0], [1, 1], [1, 2], [1, 3]] and data["mode"] == "zero"
    assert data["scored_tokens"] == 19
    assert data["loss"]["after"] - data["loss"]["before"] > 1.0
    assert len(data["top_before"]) == len(data["top_after"]) == 5
    assert all(set(c) >= {"token", "p"} for c in data["top_before"] + data["top_after"])
    assert sum(c["p"] for c in data["top_before"]) <= 1.0 + 1e-9
    ours = sa.load_pretrained("tiny-induction")
    ids = probe_ids(ours)
    with torch.no_grad():
        losses = next_token_losses(ours(ids).logits, ids)[0, 21:40]
    assert data["loss"]["before"] == pytest.approx(float(losses.mean()), abs=1e-5)


def test_ablate_command_on_a_text(run_cli):
    status, out, err = run_cli("ablate", "--model", "stories260K", "--heads", "1.0", "--mode", "mean",
                               "Once upon a time, there was a girl.", "--format", "json")
    assert status == 0, err
    data = json.loads(out)
    ours = sa.load_pretrained("stories260K")
    n = ours.tokenize("Once upon a time, there was a girl.").input_ids.shape[1]
    assert data["scored_tokens"] == n - 1 and data["mode"] == "mean" and data["text"].startswith("Once")


@pytest.mark.parametrize("argv, message", [
    (["--heads", "1.9", "--probe", "induction"], "head 9 is out of range"),
    (["--heads", "5.0", "--probe", "induction"], "layer 5 is out of range"),
    (["--heads", "1-0", "--probe", "induction"], "LAYER.HEAD pairs"),
    (["--heads", "1.0,", "--probe", "induction"], "LAYER.HEAD pairs"),
    (["--heads", "1.0"], "give a TEXT"),
    (["--heads", "1.0", "--mode", "half", "abc"], "unknown --mode"),
    (["--heads", "1.0", "abc", "--probe", "induction"], "give no sentence"),
])
def test_ablate_command_bad_input(run_cli, argv, message):
    status, out, err = run_cli("ablate", "--model", "tiny-induction", *argv)
    assert status == 2 and message in err and "Traceback" not in err and out == ""
    assert len(err.strip().splitlines()) == 1


def test_patch_command(run_cli, tmp_path):
    picture = tmp_path / "patch.png"
    status, out, err = run_cli("patch", "abcdefghijklmnopabcdefghij", "abcdefghijklmnopabcdefghiw", "--model",
                               "tiny-induction", "--target", "k", "--format", "json", "-o", str(picture))
    assert status == 0, err
    data = json.loads(out)
    expected = sa.patch_heads(sa.load_pretrained("tiny-induction"), "abcdefghijklmnopabcdefghij",
                              "abcdefghijklmnopabcdefghiw", "k")
    torch.testing.assert_close(torch.tensor(data["recovered"], dtype=torch.float64), expected)
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    status, out, err = run_cli("patch", "abcab", "abcabc", "--model", "tiny-induction", "--target", "c")
    assert status == 2 and "same token length" in err
    status, out, err = run_cli("patch", "abcab", "abcac", "--model", "tiny-induction", "--target", "zz")
    assert status == 2 and "not one" in err
    status, out, err = run_cli("patch", "abcab", "abcac", "--model", "all-MiniLM-L6-v2", "--target", "c")
    assert status == 2 and "encoder" in err


def test_a_text_of_one_token_has_nothing_to_score():
    from selfattn.analysis.next_token import text_positions

    assert text_positions(3) == [0, 1]
    with pytest.raises(sa.SentenceError, match="at least two"):
        text_positions(1)


def test_ablate_writes_the_text_with_and_without_the_heads(run_cli):
    prompt, heads = "Tim had a red ball. He gave the ball to", [(1, 2), (1, 4)]
    status, out, err = run_cli("ablate", "--model", "stories260K", "--heads", "1.2,1.4", "--generate", "12",
                               "--format", "json", prompt)
    assert status == 0 and err == ""
    written = json.loads(out)["generated"]
    model = sa.load_pretrained("stories260K")
    before = model.generate(prompt, 12)
    with sa.ablate(model, heads):
        after = model.generate(prompt, 12)
    assert (written["before"], written["after"]) == (before.text[0], after.text[0])
    assert written["ids_before"] != written["ids_after"]
    status, out, err = run_cli("ablate", "--model", "stories260K", "--heads", "1.2,1.4", "--generate", "12",
                               "--temperature", "0.8", "--generate-seed", "3", "--format", "json", prompt)
    sampled = model.generate(prompt, 12, 0.8, None, None, 3)
    assert json.loads(out)["generated"]["before"] == sampled.text[0]
    status, out, err = run_cli("ablate", "--model", "stories260K", "--heads", "1.2", "--temperature", "0.8", prompt)
    assert status == 2 and "give --generate too" in err
    status, out, err = run_cli("ablate", "--model", "stories260K", "--heads", "1.2", "--generate", "0", prompt)
    assert status == 2 and "max_new_tokens must be a whole number from 1" in err
