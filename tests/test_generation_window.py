"""Generation past the context window: every step against a fresh forward over the tokens it saw.

Reference: for each row and step, the model's plain forward ``model(ids)`` on that row's
window alone (no cache, no padding, positions from 0), where the window is read from
``Generation.window_starts``. The logits ``generate`` chose from are caught on their way
into ``choose``. Windows that share a start are read off one forward over the longest of
them (causal attention: a position's logits depend on the tokens up to it alone), so 600
steps cost one forward per distinct start, not one per step. The sliding rule is checked on its own terms: a window ends at the newest
token, never holds more than max_positions, and moves only when it is full.
"""

from __future__ import annotations

import io
import json

import pytest
import torch

import selfattn as sa
from selfattn.models import generation
from selfattn.models.decoder import DecoderConfig, DecoderModel
from selfattn.models.generation_options import MAX_NEW_TOKENS

# float32: the cached steps take the reference path one token at a time, a fresh forward over a
# long window the tiled kernel; over stories260K's 512 positions they part by up to 2e-5 (the
# logits are of order 10), so logits are held to 1e-4, as against transformers.
ATOL = {torch.float32: 1e-4, torch.float64: 1e-10}


@pytest.fixture(scope="module")
def shakespeare():
    return sa.load_pretrained("tiny-shakespeare")  # learned positions, 64 of them


def tiny_rope_model(dtype=torch.float32, **changes) -> DecoderModel:
    """A Llama-shaped decoder with 32 positions: RoPE, grouped-query attention, SwiGLU, RMSNorm.

    Weights drawn with std 0.2 (norm gains 1 + N(0, 0.2)), so attention is far from uniform.
    No tokenizer and no end-of-sequence id: ids in, every step runs.
    """
    fields = dict(
        model_type="llama", vocab_size=50, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_head=8, d_ff=48,
        activation="swiglu", norm="rms", norm_eps=1e-5, positional="rope", max_positions=32, eos_ids=(),
    )
    model = DecoderModel(DecoderConfig(**{**fields, **changes}), name="tiny-rope")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator) * 0.2
            parameter.copy_(1 + noise if "norm" in name else noise)
    return model.to(dtype).eval()


def generate_and_check(model, prompts, max_new_tokens, use_cache=True, **options):
    """Generate, then check each row's every step against a fresh forward over its window.

    Returns:
        The ``Generation`` and the logits chosen from at each step, (batch, vocab) each.
    """
    seen = []

    def choose_and_keep(logits, *args, **kwargs):
        seen.append(logits.clone())
        return real_choose(logits, *args, **kwargs)

    real_choose = generation.choose
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(generation, "choose", choose_and_keep)
        result = model.generate(prompts, max_new_tokens, use_cache=use_cache, **options)
    limit = model.config.max_positions
    atol = ATOL[model.embed.weight.dtype]
    for row, (prompt, new) in enumerate(zip(result.prompt_ids, result.ids)):
        sequence = prompt + new
        starts = result.window_starts[row]
        assert len(starts) == len(new)
        windows = []
        for t, start in enumerate(starts):
            end = len(prompt) + t  # step t saw sequence[start:end], ending at the newest token
            assert 1 <= end - start <= limit
            if t > 0 and start != starts[t - 1]:  # it slid: from a full window (full of tokens, or part padding)
                assert start > starts[t - 1] and (end - 1 - starts[t - 1] == limit or starts[t - 1] == 0)
            windows.append((start, end))
        fresh = fresh_logits(model, sequence, windows)  # (steps, vocab)
        torch.testing.assert_close(torch.stack([seen[t][row] for t in range(len(new))]), fresh, atol=atol, rtol=atol)
    return result, seen


def fresh_logits(model, sequence: list[int], windows: list[tuple[int, int]]) -> torch.Tensor:
    """The logits of a plain forward over sequence[start:end] at its last position, for each window.   -> (windows, vocab)

    Causal attention makes position i's logits depend on tokens start..i alone, so the windows
    that share a start are read off one forward over the longest of them (before the window
    slides, every step's window starts at 0): one forward per distinct start, not per step.
    """
    longest: dict[int, int] = {}
    for start, end in windows:
        longest[start] = max(end, longest.get(start, 0))
    with torch.no_grad():
        runs = {start: model(sequence[start:end]).logits[0] for start, end in longest.items()}  # (end - start, vocab)
    return torch.stack([runs[start][end - start - 1] for start, end in windows])


def check_past_the_window(model, prompts, max_new_tokens, **options):
    """Past the window with and without the cache: the same windows, the same draws, and each
    step a fresh forward; the window first slides when a step would need max_positions + 1 tokens."""
    cached, _ = generate_and_check(model, prompts, max_new_tokens, **options)
    recomputed, _ = generate_and_check(model, prompts, max_new_tokens, use_cache=False, **options)
    assert cached.ids == recomputed.ids and cached.window_starts == recomputed.window_starts
    longest = max(len(p) for p in cached.prompt_ids)
    first_full = model.config.max_positions - longest + 1  # step t sees prompt + t tokens
    assert cached.window_slid_at == recomputed.window_slid_at == first_full
    assert max(len(row) for row in cached.ids) == max_new_tokens
    assert cached.window_starts[0][-1] > 0  # the first row's oldest tokens dropped off too
    return cached


def test_tiny_shakespeare_200_greedy_tokens(shakespeare):
    result = check_past_the_window(shakespeare, "ROMEO:", 200)
    assert result.window_slid_at == 64 - 6 + 1
    assert len(set(result.window_starts[0])) > 3  # 200 tokens slide a 64-position window several times


def test_tiny_shakespeare_sampled_draws_are_the_same_with_and_without_the_cache(shakespeare):
    check_past_the_window(shakespeare, "ROMEO:", 200, temperature=0.9, top_k=30, top_p=0.95, seed=5)


def stories_without_a_stop():
    """stories260K (RoPE on llama2.c's interleaved pairs, 512 positions), not stopping at BOS:
    its stories end with BOS well before 600 tokens, and the test needs all 600."""
    import dataclasses

    model = sa.load_pretrained("stories260K")
    model.config = dataclasses.replace(model.config, eos_ids=())
    return model


ROPE_MODELS = [
    pytest.param(stories_without_a_stop, id="stories260K", marks=pytest.mark.slow),
    pytest.param(lambda: tiny_rope_model(), id="llama-shape-32"),
    pytest.param(lambda: tiny_rope_model(torch.float64), id="llama-shape-32-fp64"),
    pytest.param(lambda: tiny_rope_model(rope_pairs="interleaved"), id="interleaved-pairs"),
    pytest.param(lambda: tiny_rope_model(sliding_windows=(None, 5), max_positions=13), id="a-windowed-layer-13-positions"),
]


def _prompt(model) -> list[int]:
    return [(7 * i + 3) % model.config.vocab_size for i in range(5)]


@pytest.mark.parametrize("make_model", ROPE_MODELS)
def test_a_rope_model_600_greedy_tokens(make_model):
    model = make_model()
    check_past_the_window(model, [_prompt(model)], 600)


def test_a_rope_model_600_sampled_tokens():
    model = tiny_rope_model()
    check_past_the_window(model, [_prompt(model)], 600, temperature=1.0, top_k=20, seed=2)


def test_a_padded_batch_of_two_prompts_slides_together():
    model = tiny_rope_model()
    limit = model.config.max_positions
    short, long = [4, 9, 1], [(3 * i + 1) % 50 for i in range(limit - 4)]
    result = check_past_the_window(model, [short, long], 80, temperature=1.0, seed=0)
    padding = len(long) - len(short)
    slid = result.window_slid_at
    # The first slide drops the oldest columns: the short prompt's padding, none of its tokens yet.
    assert result.window_starts[1][slid] > 0 and result.window_starts[0][slid] == 0
    assert result.window_starts[1][slid] <= padding
    assert result.window_starts[0][-1] == result.window_starts[1][-1] - padding  # later, the same columns


def test_a_padded_batch_of_texts_slides_together(shakespeare):
    result = check_past_the_window(shakespeare, ["ROMEO:", "JULIET: O Romeo, Romeo!"], 90, temperature=0.8, seed=1)
    assert result.window_slid_at == 64 - len("JULIET: O Romeo, Romeo!") + 1


def test_window_slid_at_is_none_inside_the_positions(shakespeare):
    fits = shakespeare.generate("ROMEO:", 64 - 6 + 1)  # the last token chosen from all 64 positions
    assert fits.window_slid_at is None and set(fits.window_starts[0]) == {0}
    passes = shakespeare.generate("ROMEO:", 64 - 6 + 2)
    assert passes.window_slid_at == 64 - 6 + 1 and passes.ids[0][:-1] == fits.ids[0]


def test_a_full_prompt_slides_at_the_first_new_token_and_a_longer_one_is_refused(shakespeare):
    full = "ROMEO:\n" + "a" * 57  # 64 characters, one token each
    result, _ = generate_and_check(shakespeare, full, 3)
    assert result.window_slid_at == 1
    with pytest.raises(sa.SentenceError, match="64 positions"):
        shakespeare.generate(full + "b", 3)


def test_max_new_tokens_has_an_upper_bound(shakespeare):
    with pytest.raises(sa.OptionError, match=f"max_new_tokens must be a whole number from 1 to {MAX_NEW_TOKENS}"):
        shakespeare.generate("ROMEO:", MAX_NEW_TOKENS + 1)


def test_json_says_where_the_window_slid(run_cli):
    status, out, err = run_cli("generate", "ROMEO:", "--model", "tiny-shakespeare", "--max-new-tokens", "80",
                               "--format", "json")
    assert status == 0 and err == ""
    data = json.loads(out)
    assert data["window_slid_at"] == 59 and len(data["ids"]) == len(data["top"]) == 80
    assert {"model", "prompt", "prompt_ids", "prompt_tokens", "tokens", "readable_tokens", "ids", "text",
            "settings", "top"} < set(data)
    status, out, err = run_cli("generate", "ROMEO:", "--model", "tiny-shakespeare", "--max-new-tokens", "20",
                               "--format", "json")
    assert status == 0 and json.loads(out)["window_slid_at"] is None


def test_text_keeps_stdout_clean_and_notes_the_slide_on_stderr(run_cli):
    status, out, err = run_cli("generate", "ROMEO:", "--model", "tiny-shakespeare", "--max-new-tokens", "80")
    data = json.loads(run_cli("generate", "ROMEO:", "--model", "tiny-shakespeare", "--max-new-tokens", "80",
                              "--format", "json")[1])
    assert status == 0 and out == "ROMEO:" + data["text"] + "\n"
    assert err.count("\n") == 1 and err.startswith("selfattn: note: the context window slid from new token 59 on ")
    assert f"new token {data['window_slid_at']} on (new tokens counted from 0, as window_slid_at)" in err
    assert "64 positions" in err and "48 to 64" in err
    status, out, err = run_cli("generate", "ROMEO:", "--model", "tiny-shakespeare", "--max-new-tokens", "20")
    assert status == 0 and err == ""


def test_a_terminal_gets_the_note_after_the_text():
    from selfattn.commands.generate import generate_command

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal, notes, piped = Terminal(), io.StringIO(), io.StringIO()
    generate_command("ROMEO:", "tiny-shakespeare", 80, 0.0, None, None, None, "text", terminal, notes)
    generate_command("ROMEO:", "tiny-shakespeare", 80, 0.0, None, None, None, "text", piped, io.StringIO())
    assert terminal.getvalue() == piped.getvalue() and "from new token 59 on" in notes.getvalue()


def test_the_cli_refuses_too_many_new_tokens_in_one_line(run_cli):
    status, out, err = run_cli("generate", "ROMEO:", "--model", "tiny-shakespeare", "--max-new-tokens",
                               str(MAX_NEW_TOKENS + 1))
    assert status == 2 and out == "" and err.count("\n") == 1 and str(MAX_NEW_TOKENS) in err
