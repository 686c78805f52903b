"""Composition scores (``selfattn.composition_scores``) against the paper's formula in numpy, from the weights.

The reference builds every head's d x d OV and QK matrices in numpy from the model's
weights (norm gains folded in as the module docstring says), multiplies them whole and
takes Frobenius norms: nothing of the factored computation is shared.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import selfattn as sa
from tests.tiny_models import tiny_checkpoint


def numpy_circuits(block):
    """Each head's (OV, QK) as d x d numpy matrices, row-vector convention, gains folded in."""
    att, c = block.attention, block.attention.config
    gain = lambda norm: None if norm is None else (norm.weight.detach().double().numpy()  # noqa: E731
                                                   + (1.0 if getattr(norm, "gain", "w") == "1+w" else 0.0))
    read = gain(block.norm1)
    w = {n: getattr(att, f"w_{n}").weight.detach().double().numpy() for n in "qkvo"}
    circuits = []
    for h in range(c.n_heads):
        g = h // (c.n_heads // c.n_kv_heads)
        q = w["q"][h * c.d_head:(h + 1) * c.d_head].T  # (d, d_head)
        k = w["k"][g * c.d_head:(g + 1) * c.d_head].T
        v = w["v"][g * c.d_head:(g + 1) * c.d_head].T
        o = w["o"][:, h * c.d_head:(h + 1) * c.d_head].T  # (d_head, d)
        q, k, v = read[:, None] * q, read[:, None] * k, read[:, None] * v
        if att.q_norm is not None:
            q, k = q * gain(att.q_norm)[None], k * gain(att.k_norm)[None]
        post = gain(block.post_attention_norm)
        if post is not None:
            o = o * post[None]
        circuits.append((v @ o, q @ k.T))
    return circuits


@pytest.mark.parametrize("name", ["tiny-induction", "llama", "gemma3_text", "qwen3"])
def test_scores_are_the_papers_formula(name, tmp_path):
    model = sa.load_pretrained(name if name == "tiny-induction" else tiny_checkpoint(name, tmp_path))
    found = sa.composition_scores(model)
    circuits = [numpy_circuits(b) for b in model.blocks]
    f = np.linalg.norm
    for (l1, h1, l2, h2) in [(0, 0, 1, 0), (0, 3, 1, 2), (0, 1, 1, 3)]:
        ov1, _ = circuits[l1][h1]
        ov2, qk2 = circuits[l2][h2]
        expected = {"q": f(ov1 @ qk2) / (f(ov1) * f(qk2)), "k": f(ov1 @ qk2.T) / (f(ov1) * f(qk2)),
                    "v": f(ov1 @ ov2) / (f(ov1) * f(ov2))}
        for mode, value in expected.items():
            assert float(getattr(found, mode)[l1, h1, l2, h2]) == pytest.approx(value, rel=1e-4), (mode, l1, h1, l2, h2)
    assert bool(found.k[1, :, 0, :].isnan().all()) and bool(found.k[0, :, 0, :].isnan().all())
    for mode in "qkv":  # random factors of these shapes: the products barely line up
        assert 0 < found.baseline[mode] < 0.5


def test_tiny_induction_keys_read_a_previous_token_head_and_path_patching_agrees():
    model = sa.load_pretrained("tiny-induction")
    found = sa.composition_scores(model)
    l1, h1, l2, h2, score = found.strongest("k", 1)[0]
    assert (l1, l2) == (0, 1) and score > 2 * found.baseline["k"]
    # The writer is a previous-token head, the reader an induction head (the probe's scores).
    import torch

    from selfattn.analysis.decoder_roles import induction_probe_score
    from selfattn.analysis.probes import induction_probe_for

    probe = induction_probe_for(model, 20, 0)
    with torch.no_grad():
        weights = torch.stack(model(probe.ids, output_attentions=True).attentions)[:, 0]  # (layers, H, n, n)
    previous = float(torch.diagonal(weights[l1, h1], offset=-1)[1:].mean())  # each token's weight on the one before
    assert previous > 0.5
    assert float(induction_probe_score(weights, probe.length, probe.offset)[l2, h2]) > 0.5
    clean, corrupted = "abcdefghijklmnopabcdefghij", "abcdefghiwklmnopabcdefghij"
    by_key = sa.patch_heads(model, clean, corrupted, "k", senders=[(l1, h1)], receivers=[(l2, h2)], via="k")
    by_query = sa.patch_heads(model, clean, corrupted, "k", senders=[(l1, h1)], receivers=[(l2, h2)], via="q")
    assert float(by_key) > float(by_query) + 0.1


def test_the_heads_command_prints_the_strongest_pairs(run_cli):
    status, out, err = run_cli("heads", "--composition", "--model", "tiny-induction", "--format", "json")
    assert status == 0 and err == ""
    data = json.loads(out)
    found = sa.composition_scores(sa.load_pretrained("tiny-induction"))
    assert set(data["composition"]) == {"q", "k", "v"} and data["baseline"]["k"] == pytest.approx(found.baseline["k"])
    assert np.asarray(data["composition"]["k"], dtype=float).shape == (2, 4, 2, 4)
    top = data["strongest"]["k"][0]
    assert (top["writer"], top["reader"]) == ([0, 3], [1, 2]) and top["score"] == pytest.approx(found.strongest("k", 1)[0][4])
    status, out, err = run_cli("heads", "--composition", "--model", "tiny-induction")
    assert status == 0 and "K-composition" in out and "0.3 -> 1.2" in out
    status, out, err = run_cli("heads", "--composition", "--model", "tiny-induction", "some text")
    assert status == 2 and "--composition reads the weights" in err
    status, out, err = run_cli("heads", "--composition", "--model", "tiny-induction", "--probe", "induction")
    assert status == 2 and "--composition reads the weights" in err
