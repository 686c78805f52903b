"""What the variant walkthrough says about scaling and about untrained weights.

Two notes, kept apart from the layout of the steps in ``variant_walkthrough``:

- scaling: why the scores are divided by sqrt(d_k), what that corrects (the growth of a
  dot product's spread with the width) and what it does not (long vectors, and, without
  projections, a query's score with itself), with runs that show each case;
- untrained weights: how close to uniform the seeded projections left the query's
  weights, and where to see a trained model's heads instead.

Every number is read from the trace (spreads and entropies of its scores and weights);
nothing here computes a dot product or a softmax. The suggested runs are fixed commands
on the seed's sentence, each with the effect it shows on the line below it:
tests/test_scaling_claims.py runs every one and checks that line against its JSON.
"""

from __future__ import annotations

import math

import torch

from selfattn.render.text.document import Block, Heading, Lines, Paragraph, display_token, fmt
from selfattn.trace.record import AttentionTrace

WIDE = 16  # from this d_k on, the run itself shows what scaling does; no need to suggest a wider one
CLOSE_TO_UNIFORM = 0.95  # entropy / its maximum from which weights are called close to uniform

# Suggested runs: (command, the effect its output shows). The numbers are claims the tests check.
WIDE_WITH_PROJECTIONS = (
    "selfattn explain --variant qkv --embed random --dim 64 --d-k 64",
    "with projections: the largest weight of 'cat' falls from 1.000 unscaled to about 0.5",
)
WIDE_WITHOUT_PROJECTIONS = (
    "selfattn explain --variant scaled --embed random --dim 64",
    "without projections: 'cat' keeps above 0.9 of its weight on itself, unscaled and scaled",
)
TRAINED_HEAD = (
    "selfattn explain --model all-MiniLM-L6-v2 --layer 0 --head 2",
    "a trained head: 'cat' puts above 0.9 of its weight on 'the', the token before it",
)
EVERY_TRAINED_HEAD = (
    "selfattn heads",
    "every head's role and entropy; the most focused have H / log2 n near 0",
)


def _runs(runs: list[tuple[str, str]]) -> Lines:
    """Each command on its own line, the effect it shows indented under it."""
    return Lines([line for command, effect in runs for line in (command, f"    → {effect}")])


def _spread(scores: torch.Tensor) -> float:
    """The standard deviation of a set of scores, for display."""
    return float(scores.double().std(correction=0))


def entropy(weights: torch.Tensor) -> float:
    """H = -sum w ln w in nats: 0 for one-hot, ln n for uniform."""
    w = weights[weights > 0].double()
    return float(-(w * w.log()).sum())


def scaling_section(t: AttentionTrace, p: int) -> list[Block]:
    """Why the scores are divided by sqrt(d_k), what that corrects and what not, what it did here, runs that show it.

    Args:
        t: the record (``AttentionTrace``) of a scaled variant (every variant but simple and flash).
        p: the decimals of the numbers read from the trace.

    Returns:
        A heading, the paragraphs, then the suggested runs (none when this run shows both cases).
    """
    projected, d_k = t.section("projections") is not None, int(t.steps.q.shape[-1])
    width = (
        "A score adds up d_k products, one per component. When the components of the query and the key are "
        "independent with mean 0 and variance 1, each product has variance 1 and their sum variance d_k: the "
        "scores spread about √d_k around 0 (their standard deviation), wider the wider the vectors. Softmax over "
        "widely spread scores gives nearly all the weight to one token, where its gradients vanish. Dividing by "
        "√d_k cancels exactly this growth: scaled, the scores spread about 1 whatever d_k."
        + ("" if projected else f" (Here the keys are the embeddings themselves, so d_k = d = {d_k}.)")
    )
    size = (
        "It corrects for width, not for size. A score is |q| |k| cos θ, so vectors 10× longer give scores 100× "
        "larger while √d_k, which only counts components, stays the same, and the softmax is as peaked as the "
        "long vectors make it. Keeping the components near variance 1 is the job of the rest of a model "
        "(LayerNorm, weights that start at the right scale)."
    )
    here = _spread_here(t) if projected else _self_score(t, p)
    return [Heading("Why divide by √d_k", level=2), Paragraph(width), Paragraph(size), Paragraph(here), *_effect(t)]


def _spread_here(t: AttentionTrace) -> str:
    """With projections: the inputs' mean square and the spread of head 0's scores before and after scaling."""
    s, n = t.steps, len(t.tokens)
    d_k = int(s.q.shape[-1])
    return (
        f"Here the components of the inputs have a mean square of {fmt(s.input.double().pow(2).mean(), 2)} "
        f"(1 for variance 1), and the {n} × {n} = {n * n} scores{' of head 0' if s.n_heads > 1 else ''} spread by "
        f"{fmt(_spread(s.scores[0]), 2)} unscaled and {fmt(_spread(s.scaled[0]), 2)} after ÷ √{d_k}."
    )


def _self_score(t: AttentionTrace, p: int) -> str:
    """Without projections the query's key is the query: its self-score against its best other score."""
    s, q, n = t.steps, t.query.index, len(t.tokens)
    name = display_token(t.tokens[q])
    text = (
        "Without projections the query's key is the query itself, so its score with itself is |x_q|², about d "
        "for components of variance 1, while its scores with the other tokens spread about √d around 0. The "
        "self-score leads by about d, and after ÷ √d still by about √d, a lead that grows with the width: "
        "scaling cannot take the weight off the query itself."
    )
    others = [j for j in range(n) if j != q]
    if not others:
        return text
    row, scaled, d_k = s.scores[0, q], s.scaled[0, q], int(s.q.shape[-1])
    best = max(others, key=lambda j: float(row[j]))
    here = (
        f" Here '{name}' · '{name}' = {fmt(row[q], p)} and its best other score is {fmt(row[best], p)} "
        f"('{display_token(t.tokens[best])}')"
    )
    if float(row[q]) > float(row[best]):
        return text + here + f": a lead of {fmt(row[q] - row[best], p)}, {fmt(scaled[q] - scaled[best], p)} after ÷ √{d_k}."
    if t.tokens[best] == t.tokens[q] and torch.equal(s.input[best], s.input[q]):
        return text + here + ": the same token with the same vector, so the same score."
    return text + here + ", no lower: these vectors are not the kind the rule of thumb describes."


def _effect(t: AttentionTrace) -> list[Block]:
    """What scaling did to the query's largest weight in head 0, then runs that show the cases this run does not."""
    s, q = t.steps, t.query.index
    projected, d_k = t.section("projections") is not None, int(s.q.shape[-1])
    before, after = float(t.sections["scaling"].weights_unscaled[0, q].max()), float(s.weights[0, q].max())
    head = " in head 0" if s.n_heads > 1 else ""
    text = (
        f"Dividing by √{d_k} moved the largest weight of '{display_token(t.tokens[q])}'{head} from {before:.3f} "
        f"to {after:.3f}: "
        + ("the weights got flatter." if after < before else "the weights got more peaked." if after > before else "no change.")
    )
    runs = []
    if not (projected and d_k >= WIDE):
        runs.append(WIDE_WITH_PROJECTIONS)
    if projected or d_k < WIDE:
        runs.append(WIDE_WITHOUT_PROJECTIONS)
    if not runs:
        return [Paragraph(text)]
    cases = "both cases, each" if len(runs) > 1 else "the other case"
    text += (
        f" How much depends on the width and on the projections; on the seed's sentence these runs show {cases} "
        "in its own table (α unscaled beside α):"
    )
    return [Paragraph(text), _runs(runs)]


def untrained_note(t: AttentionTrace) -> list[Block]:
    """How close to uniform the untrained projections left the query's weights, and where trained heads are.

    The query's row in every head, over the tokens it may see; uniform is 1 / their number,
    and the entropy is given as a share of its maximum, ln of their number.

    Args:
        t: the record (``AttentionTrace``) of a variant with projections.

    Returns:
        A paragraph, then the runs with a trained model.
    """
    s, q, seed = t.steps, t.query.index, t.sections["inputs"].seed
    name = display_token(t.tokens[q])
    allowed = s.allowed[q] if s.allowed is not None else torch.ones(len(t.tokens), dtype=torch.bool)
    seen = int(allowed.sum())
    rows = s.weights[:, q][:, allowed]  # (H, seen): the query's weights over the tokens it may see
    untrained = f"These projections are untrained (seed {seed})"
    if seen == 1:
        text = f"{untrained}. '{name}' may see only itself, so its one weight is 1 whatever they are."
    else:
        shares = [entropy(row) / math.log(seen) for row in rows]
        low, high, uniform = float(rows.min()), float(rows.max()), 1 / seen
        heads = {1: "", 2: " in both heads"}.get(s.n_heads, f" in all {s.n_heads} heads")
        over = f" over the {seen} tokens it may see" if s.allowed is not None else ""
        share = (
            f"entropy {math.floor(100 * shares[0])}% of the maximum"
            if s.n_heads == 1
            else f"entropy at least {math.floor(100 * min(shares))}% of the maximum in each head"
        )
        spread = f"for '{name}' every weight{heads} is between {low:.3f} and {high:.3f}, where uniform{over} would be {uniform:.3f} ({share})"
        if min(shares) >= CLOSE_TO_UNIFORM:
            text = f"{untrained}, so the weights came out close to uniform: {spread}."
        else:
            alibi = t.sections["positional"].alibi_bias is not None
            cause = "the ALiBi distance penalty and the arithmetic" if alibi else "the arithmetic (see the scaling above)"
            text = f"{untrained}, yet the weights are not close to uniform: {spread}. Such peaks come from {cause}, not from anything learned."
    text += " A trained model's heads are far from uniform, each with a pattern of its own:"
    return [Paragraph(text), _runs([TRAINED_HEAD, EVERY_TRAINED_HEAD])]
