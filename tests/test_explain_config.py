"""The explain configuration (the import rules of the architecture are in test_layers.py)."""

import ast
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from seed_reference import CAT_CONTEXT, INPUTS, at_4_decimals
from selfattn import ExplainConfig, OptionError, SentenceError, build_trace

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "selfattn"


def test_default_config_is_the_seed_example():
    trace = build_trace(ExplainConfig())
    walk = trace.sections["seed"]  # the seed's walk of its query
    assert trace.tokens[walk.index] == "cat"
    torch.testing.assert_close(trace.embeddings, torch.tensor(INPUTS))
    assert at_4_decimals(walk.context.tolist()) == CAT_CONTEXT


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(format="yaml"), "unknown format"),
        (dict(precision=11), "--precision"),
        (dict(precision=True), "--precision"),
        (dict(dim=0), "--dim"),
        (dict(embed="glove"), "unknown embedding method"),
        (dict(embeddings="t.json", embed="seed"), "exclude each other"),
        (dict(seed="1"), "--seed must be an integer"),
    ],
)
def test_invalid_configs_cannot_be_built(kwargs, match):
    with pytest.raises(OptionError, match=match):
        ExplainConfig(**kwargs)


def test_config_is_frozen():
    config = ExplainConfig()
    with pytest.raises(AttributeError):
        config.precision = 2  # type: ignore[misc]


def test_every_format_takes_the_toy_positions_and_no_more():
    for output in ("text", "markdown", "json", "html", "plot"):
        assert len(build_trace(ExplainConfig(sentence=" ".join(["w"] * 512), format=output)).tokens) == 512
        with pytest.raises(SentenceError, match="513 tokens.*at most 512"):
            build_trace(ExplainConfig(sentence=" ".join(["w"] * 513), format=output))


@settings(max_examples=40, deadline=None)
@given(
    words=st.lists(st.sampled_from(["The", "cat", "sat", "on", "the", "warm", "mat", "dog", "ran", "42"]), min_size=1, max_size=12),
    dim=st.integers(1, 9),
    seed=st.integers(-(2**40), 2**40),
    query=st.integers(0, 11),
)
def test_any_sentence_matches_sdpa_and_softmax(words, dim, seed, query):
    """Property: for any sentence, width, seed and query, the trace agrees with PyTorch."""
    query = query % len(words)
    trace = build_trace(ExplainConfig(sentence=" ".join(words), dim=dim, seed=seed, query=query, format="json"))
    x = trace.embeddings
    walk, weights, context = trace.sections["seed"], trace.steps.weights[0], trace.steps.context[0]  # the one head
    assert walk.index == query and x.shape == (len(words), dim)
    torch.testing.assert_close(context, F.scaled_dot_product_attention(x, x, x, scale=1.0))
    torch.testing.assert_close(weights, torch.softmax(x @ x.T, dim=-1))
    torch.testing.assert_close(walk.weights, weights[query])
    torch.testing.assert_close(walk.context, context[query])
    torch.testing.assert_close(weights.sum(dim=-1), torch.ones(len(words)))


def test_no_module_borrows_torchs_attention_or_softmax():
    """The attention math is ours: nothing in the package calls torch's softmax or SDPA."""
    borrowed = {"softmax", "scaled_dot_product_attention", "log_softmax", "multi_head_attention_forward"}
    # The ring demo prints its difference from torch's SDPA: there SDPA is the reference, not our math.
    references = {PACKAGE / "distributed" / "demo.py"}
    for path in sorted(set(PACKAGE.rglob("*.py")) - references):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in borrowed:
                owner = ast.unparse(node.value)
                assert not owner.startswith(("torch", "F", "nn")), f"{path.name} calls {owner}.{node.attr}"


def test_build_trace_resolves_a_model_name_once(monkeypatch):
    """The config resolves the name when it is built; build_trace loads by that, without resolving again."""
    import selfattn.models.locate as locate

    calls = []
    real = locate.model_key

    def counting(name):
        calls.append(name)
        return real(name)

    monkeypatch.setattr(locate, "model_key", counting)  # both the config's check and the loader read it from here
    config = ExplainConfig(sentence="a b a", model="tiny-induction")
    trace = build_trace(config)
    assert calls == ["tiny-induction"] and config.model_key == "tiny-induction"
    assert trace.sections["model"].model_name == "tiny-induction"
