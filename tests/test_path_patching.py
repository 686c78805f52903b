"""Path patching (``patch_heads(..., senders, receivers, via)``) against transformers with hooks on the receivers' projections.

The reference (tests/hf_parts.py) is written on transformers' modules alone: from its
clean and corrupted runs it takes each sender's output (its o_proj input through W_o), adds
the senders' clean-minus-corrupted outputs to the stream entering the receivers' layer,
projects that stream's norm with the layer's own q/k/v projections, and feeds the
receivers' columns to forward hooks on those projections in a corrupted run.
"""

from __future__ import annotations

import json

import pytest
import torch

import selfattn as sa
from selfattn.analysis.head_interventions import patching
from selfattn.models.files import model_folder
from tests.hf_parts import hf_path_patching
from tests.tiny_models import reference_model, tiny_checkpoint

transformers = pytest.importorskip("transformers")
CLEAN, CORRUPTED = "abcdefghijklmnopabcdefghij", "abcdefghiwklmnopabcdefghij"  # the first copy's 'j' changed


@pytest.fixture(scope="module")
def induction():
    theirs = transformers.GPT2LMHeadModel.from_pretrained(model_folder("tiny-induction"), attn_implementation="eager")
    return sa.load_pretrained("tiny-induction"), theirs.eval()


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    folder = tiny_checkpoint("llama", tmp_path_factory.mktemp("llama"), num_hidden_layers=3)
    return sa.load_pretrained(folder), reference_model(folder)


@pytest.mark.parametrize(("senders", "receivers", "via"), [
    ([(0, 3)], [(1, 0)], "k"), ([(0, 3)], [(1, 0)], "q"), ([(0, 2), (0, 3)], [(1, 0), (1, 2)], "v"),
    ([(0, 0), (0, 1), (0, 2), (0, 3)], [(1, 1)], "qkv"),
])
def test_tiny_induction_matches_transformers(induction, senders, receivers, via):
    ours, theirs = induction
    ids = [ours.tokenize(t).input_ids for t in (CLEAN, CORRUPTED)]
    target = ours.tokenizer.token_to_id("k")
    got = sa.patch_heads(ours, ids[0][0].tolist(), ids[1][0].tolist(), target, senders=senders, receivers=receivers,
                         via=via)
    expected = hf_path_patching(theirs, ids[0], ids[1], target, senders, receivers, via)
    assert abs(float(got) - expected) < 1e-4


def test_the_induction_head_reads_the_previous_token_head_through_its_keys(induction):
    ours, _ = induction
    by_key = sa.patch_heads(ours, CLEAN, CORRUPTED, "k", senders=[(0, 3)], receivers=[(1, 0)], via="k")
    by_query = sa.patch_heads(ours, CLEAN, CORRUPTED, "k", senders=[(0, 3)], receivers=[(1, 0)], via="q")
    assert float(by_key) > 0.15 and abs(float(by_query)) < 0.01


@pytest.mark.parametrize(("senders", "receivers", "via"), [
    ([(0, 1)], [(2, 3)], "k"),  # key/value head 1, read by query heads 2 and 3
    ([(0, 0), (1, 2)], [(2, 0), (2, 3)], "qv"),
])
def test_a_grouped_llama_matches_transformers_and_names_the_heads_a_shared_input_touches(llama, senders, receivers, via):
    ours, theirs = llama
    clean, corrupted = "The cat sat on the warm mat. The cat", "The dog sat on the warm mat. The cat"
    ids = [ours.tokenize(t).input_ids for t in (clean, corrupted)]
    assert ids[0].shape == ids[1].shape
    target = int(theirs(ids[0]).logits[0, -1].argmax())
    run = patching(ours, ids[0][0].tolist(), ids[1][0].tolist(), target, senders, receivers, via)
    expected = hf_path_patching(theirs, ids[0], ids[1], target, senders, receivers, via)
    assert abs(run.recovered - expected) < 1e-4
    if "k" in via or "v" in via:
        assert run.touched == sorted({(2, 2) if h == 3 else (2, 1) for _, h in receivers} - set(receivers))


def test_every_earlier_head_as_sender_is_patching_the_receivers_inputs(llama):
    """Senders = every head before the receivers' layer, via all three: the receivers then read the stream of a run
    whose earlier heads all gave their clean outputs while the MLPs and embeddings kept the corrupted run's. The
    same run made with hooks on every earlier head's result and MLP output gives the same answer."""
    ours, _ = llama
    clean, corrupted = "The cat sat on the warm mat. The cat", "The dog sat on the warm mat. The cat"
    receivers = [(2, 0), (2, 3)]
    senders = [(l, h) for l in range(2) for h in range(4)]
    with torch.no_grad():
        wanted = int(ours(clean).logits[0, -1].argmax())
    run = patching(ours, clean, corrupted, wanted, senders, receivers, "qkv")
    names = [f"blocks.{l}.attn.hook_result" for l in range(2)] + [f"blocks.{l}.hook_mlp_out" for l in range(2)]
    with sa.capture(ours, names) as seen_clean, torch.no_grad():
        ours(clean)
    seen_clean = dict(seen_clean)
    with sa.capture(ours, names) as seen_corrupted, torch.no_grad():
        ours(corrupted)
    seen_corrupted = dict(seen_corrupted)
    table = {f"blocks.{l}.attn.hook_result": (lambda x, p, l=l: seen_clean[f"blocks.{l}.attn.hook_result"]) for l in range(2)}
    table |= {f"blocks.{l}.hook_mlp_out": (lambda x, p, l=l: seen_corrupted[f"blocks.{l}.hook_mlp_out"]) for l in range(2)}
    inputs = [f"blocks.2.attn.hook_{x}" for x in "qkv"]
    with sa.hooks(ours, table), sa.capture(ours, inputs) as moved, torch.no_grad():
        ours(corrupted)
    moved = dict(moved)

    def put(name, rows):
        def hook(value, point):
            value = value.clone()
            value[:, rows] = moved[name][:, rows]
            return value
        return hook

    replace = {inputs[0]: put(inputs[0], [0, 3]), inputs[1]: put(inputs[1], [0, 1]), inputs[2]: put(inputs[2], [0, 1])}
    with sa.hooks(ours, replace), torch.no_grad():
        lp = float(ours(corrupted).logits[0, -1].double().log_softmax(-1)[wanted])
    assert abs((lp - run.lp_corrupted) / (run.lp_clean - run.lp_corrupted) - run.recovered) < 1e-4  # float32 apart


def test_positions_keep_a_heads_clean_output_to_some_positions(induction):
    ours, _ = induction
    n = len(ours.tokenize(CLEAN).tokens[0])
    everywhere = sa.patch_heads(ours, CLEAN, CORRUPTED, "k")
    torch.testing.assert_close(sa.patch_heads(ours, CLEAN, CORRUPTED, "k", positions=list(range(n))), everywhere)
    # Only the first copy's 'k' (position 11 after <s>), where the previous-token heads write 'j' for the induction heads' keys.
    at_k = sa.patch_heads(ours, CLEAN, CORRUPTED, "k", positions=[11])
    assert float(at_k[0].max()) > 0.5 * float(everywhere[0].max()) and float(at_k[1].abs().max()) < 0.05
    path_at_k = sa.patch_heads(ours, CLEAN, CORRUPTED, "k", senders=[(0, 3)], receivers=[(1, 0)], via="k", positions=[11])
    path = sa.patch_heads(ours, CLEAN, CORRUPTED, "k", senders=[(0, 3)], receivers=[(1, 0)], via="k")
    assert abs(float(path_at_k) - float(path)) < 0.02


@pytest.mark.parametrize(("options", "message"), [
    (dict(senders=[(1, 0)], receivers=[(1, 2)]), "sender 1.0 is not before every receiver"),
    (dict(senders=[(0, 0)]), "senders and receivers together"),
    (dict(senders=[(0, 0)], receivers=[(1, 0)], via="x"), "via names"),
    (dict(senders=[(0, 0)], receivers=[(1, 0)], via="kk"), "via names"),
    (dict(via="k"), "goes with senders and receivers"),
    (dict(senders=[(0, 9)], receivers=[(1, 0)]), "head 9 is out of range"),
    (dict(positions=[99]), "positions must be"),
    (dict(positions=[]), "positions must be"),
])
def test_bad_path_options_are_refused(induction, options, message):
    ours, _ = induction
    with pytest.raises(sa.OptionError, match=message):
        sa.patch_heads(ours, CLEAN, CORRUPTED, "k", **options)


def test_the_patch_command_patches_a_path_and_says_what_a_shared_input_touches(run_cli):
    status, out, err = run_cli("patch", CLEAN, CORRUPTED, "--model", "tiny-induction", "--target", "k",
                               "--senders", "0.3", "--receivers", "1.0", "--via", "k", "--format", "json")
    assert status == 0 and err == ""
    data = json.loads(out)
    expected = sa.patch_heads(sa.load_pretrained("tiny-induction"), CLEAN, CORRUPTED, "k", senders=[(0, 3)],
                              receivers=[(1, 0)], via="k")
    assert data["recovered"] == pytest.approx(float(expected), abs=1e-9)
    assert data["senders"] == [[0, 3]] and data["receivers"] == [[1, 0]] and data["via"] == "k"
    assert data["touched"] == [] and data["warning"] is None and data["positions"] is None
    status, out, err = run_cli("patch", CLEAN, CORRUPTED, "--model", "tiny-induction", "--target", "k",
                               "--senders", "0.3", "--receivers", "1.0", "--via", "k")
    assert status == 0 and f"Recovered: {float(expected):.2f}" in out and "the keys of the receivers 1.0" in out
    status, out, err = run_cli("patch", CLEAN, CORRUPTED, "--model", "tiny-induction", "--target", "k",
                               "--positions", "11", "--format", "json")
    assert status == 0 and json.loads(out)["positions"] == [11]


def test_a_clean_input_no_better_than_the_corrupted_one_is_warned_about(run_cli):
    status, out, err = run_cli("patch", CORRUPTED, CLEAN, "--model", "tiny-induction", "--target", "k", "--format", "json")
    assert status == 0
    warning = json.loads(out)["warning"]
    assert warning.startswith("the clean input gives the target a log-probability no higher than the corrupted one")
    status, out, err = run_cli("patch", CORRUPTED, CLEAN, "--model", "tiny-induction", "--target", "k")
    assert out.splitlines()[2].startswith("Warning: the clean input gives")


@pytest.mark.parametrize(("argv", "message"), [
    (["--senders", "0.3"], "--senders and --receivers together"),
    (["--senders", "0.3", "--receivers", "1"], "--receivers takes LAYER.HEAD pairs"),
    (["--via", "k"], "--via goes with --senders and --receivers"),
    (["--senders", "0.3", "--receivers", "1.0", "--via", "kx"], "--via names the receivers' inputs"),
    (["--positions", "1,x"], "--positions takes whole numbers"),
    (["--senders", "0.3", "--receivers", "1.0", "-o", "p.png"], "path patching gives one number"),
    (["--senders", "1.3", "--receivers", "1.0"], "sender 1.3 is not before every receiver"),
    (["--positions", "99"], "positions must be"),
])
def test_bad_path_options_in_the_command_are_one_line(run_cli, argv, message):
    status, out, err = run_cli("patch", CLEAN, CORRUPTED, "--model", "tiny-induction", "--target", "k", *argv)
    assert status == 2 and message in err and len(err.strip().splitlines()) == 1


def test_a_target_of_two_tokens_is_refused_with_one_token_words_close_to_it():
    model = sa.load_pretrained("stories260K")
    with pytest.raises(sa.OptionError, match="one-token words close to it: ' Tim'"):
        sa.patch_heads(model, "Tom saw Tom", "Tom saw Sam", "Tom")
