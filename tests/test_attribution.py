"""Direct logit attribution (``selfattn.attribute``) against transformers' own modules.

For a tiny random checkpoint of every decoder family, each head's share of a logit is
worked out in the test from transformers' forward (the o_proj input of each head, the
final norm's scale at the run's vector, Gemma's post-attention norm likewise, the
unembedding; tests/hf_parts.py), and the shares ours gives must add up to the logit the
model gives.
"""

from __future__ import annotations

import json

import pytest
import torch

import selfattn as sa
from tests.hf_parts import head_share, hf_parts
from tests.tiny_models import DECODERS, reference_model, tiny_checkpoint

transformers = pytest.importorskip("transformers")
TEXT = "The cat sat on the warm mat. The cat sat on the"


@pytest.fixture(scope="module", params=DECODERS)
def family(request, tmp_path_factory):
    folder = tiny_checkpoint(request.param, tmp_path_factory.mktemp(request.param))
    return sa.load_pretrained(folder), reference_model(folder)


@pytest.mark.parametrize("position", [None, 4])
def test_each_heads_share_is_transformers_and_the_shares_add_up(family, position):
    ours, hf = family
    ids = ours.tokenize(TEXT).input_ids
    parts = hf_parts(hf, ids)
    at = ids.shape[1] - 1 if position is None else position
    for target in (int(parts.logits[at].argmax()), 7):
        found = sa.attribute(ours, ids[0].tolist(), target, position)
        assert found.position == at and found.target == target
        assert abs(found.logit - float(parts.logits[at, target])) < 1e-4
        assert abs(found.total - found.logit) < 1e-4
        expected = torch.tensor([[head_share(hf, parts, l, h, at, target) for h in range(found.heads.shape[1])]
                                 for l in range(found.heads.shape[0])], dtype=torch.float64)
        torch.testing.assert_close(found.heads, expected, atol=1e-4, rtol=1e-4)
        assert float(found.heads.abs().max()) > 0.05  # the heads write something: a wrong scale would show
        names = [name for name, _ in found.components]
        assert names[0] == "embeddings" and "MLP 1" in names
        assert ("final norm bias" in names) == (hf.config.model_type == "gpt2")
        assert ("attention bias 0" in names) == (hf.config.model_type == "gpt2")


def test_a_bad_position_or_target_is_one_line():
    model = sa.load_pretrained("tiny-induction")
    with pytest.raises(sa.OptionError, match=r"the position must be a whole number from 0 to 7 \(the text has 8 tokens\)"):
        sa.attribute(model, "kqbxkqb", "x", 8)
    with pytest.raises(sa.OptionError, match="not one"):
        sa.attribute(model, "kqbxkqb", "xy")
    with pytest.raises(sa.SentenceError, match="one text"):
        sa.attribute(model, ["kqb", "xkq"], "x")
    with pytest.raises(sa.ModelError, match="not a decoder"):
        sa.attribute(sa.load_pretrained("all-MiniLM-L6-v2"), "a cat", "cat")


def test_the_command_prints_the_heads_and_the_sum(run_cli, tmp_path):
    status, out, err = run_cli("attribute", "kqbxkqb", "--model", "tiny-induction", "--target", "x", "--format", "json")
    assert status == 0 and err == ""
    data = json.loads(out)
    assert set(data) >= {"model", "text", "target", "position", "heads", "components", "total", "logit"}
    found = sa.attribute(sa.load_pretrained("tiny-induction"), "kqbxkqb", "x")
    assert data["logit"] == pytest.approx(found.logit, abs=1e-6) and data["total"] == pytest.approx(found.total, abs=1e-6)
    assert len(data["heads"]) == 8 and {"layer", "head", "logit"} == set(data["heads"][0])
    by_head = {(h["layer"], h["head"]): h["logit"] for h in data["heads"]}
    assert by_head[(1, 2)] == pytest.approx(float(found.heads[1, 2]), abs=1e-6)
    assert data["components"][0]["name"] == "embeddings"
    status, out, err = run_cli("attribute", "kqbxkqb", "--model", "tiny-induction", "--target", "x")
    assert status == 0 and "total" in out and "logit" in out
    picture = tmp_path / "heads.png"
    status, out, err = run_cli("attribute", "kqbxkqb", "--model", "tiny-induction", "--target", "x", "-o", str(picture))
    assert status == 0 and picture.stat().st_size > 1000


@pytest.mark.parametrize(("argv", "message"), [
    (["attribute", "kqbxkqb", "--model", "tiny-induction"], "--target"),
    (["attribute", "kqbxkqb", "--model", "tiny-induction", "--target", "x", "--position", "8"], "position"),
    (["attribute", "kqbxkqb", "--model", "tiny-induction", "--target", "x", "--position", "-1"], "position"),
    (["attribute", "kqbxkqb", "--model", "tiny-induction", "--target", "x", "-o", "heads.gif"], ".png or .svg"),
    (["attribute", "", "--model", "tiny-induction", "--target", "x"], "empty"),
])
def test_the_command_refuses_bad_input_in_one_line(run_cli, argv, message):
    status, out, err = run_cli(*argv)
    assert status == 2 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
