"""A variant's steps, one function per idea it brings: ``explain.walk`` calls them in reading order.

The positional encoding, the Q/K/V projections, the causal mask, each head (scores,
scaling, softmax, its output) and the output with the heads' concatenation and output
projection. All numbers come from the record; nothing here computes attention.
"""

from __future__ import annotations

import math

import torch

from selfattn.render.text.document import (
    QUERY_KEY_AXES,
    Document,
    Heading,
    Lines,
    Note,
    Paragraph,
    MAX_SHOWN_DIMS,
    Table,
    component_headers,
    display_token,
    fmt,
    fmt_vector,
    left_out_line,
    token_lines,
    token_matrix,
    token_table,
    vector_cells,
)
from selfattn.render.text.variant_notes import entropy, scaling_section, untrained_note
from selfattn.trace.record import AttentionTrace, LayerSteps
from selfattn.trace.variant_names import MULTI_HEAD, UNSCALED

TERMS_SHOWN_UP_TO_DIM = 4

INTRO = {
    "simple": "the seed's attention, softmax(X Xᵀ) X, here with a positional encoding",
    "scaled": "the seed's attention with the scores divided by √d before the softmax",
    "qkv": "queries, keys and values as three learned linear views of the embeddings",
    "causal": "Q/K/V attention where no token may look at a token after it",
    "multihead": "several Q/K/V heads side by side, concatenated and mixed by an output projection",
    "gqa": "grouped-query attention: many query heads share fewer key/value heads",
    "flash": "the seed's attention computed as flash attention does, reading the keys one block at a time",
}


def _label(t: AttentionTrace, j: int) -> str:
    return display_token(t.tokens[j])


def _rows(t: AttentionTrace, p: int, columns: list[torch.Tensor]) -> list[list[str]]:
    """One row per token: its label, then one number from each (n,) column."""
    return [[_label(t, j)] + [fmt(col[j], p) for col in columns] for j in range(len(t.tokens))]


def _unrotated(s: LayerSteps) -> tuple[torch.Tensor, torch.Tensor]:
    """The queries (H, n, d_k) and keys (K, n, d_k) before RoPE: q and k themselves without it."""
    return (s.q if s.q_plain is None else s.q_plain), (s.k if s.k_plain is None else s.k_plain)


def positional_step(doc: Document, t: AttentionTrace, p: int, step: int) -> None:
    s, pos = t.steps, t.sections["positional"]
    d = t.embeddings.shape[1]
    q = t.query.index
    if pos.encoding is not None:
        seed = t.sections["inputs"].seed
        what = (
            "the sinusoidal table of Vaswani et al.: column 2i is sin(pos / 10000^(2i/d)), column 2i+1 the "
            "matching cos, so every position gets its own pattern of waves"
            if pos.name == "sinusoidal"
            else f"a learned table, one row per position (here seeded and untrained, seed {seed}, N(0, 0.02²))"
        )
        doc.add(
            Heading(f"Step {step} · Positional encoding ({pos.name}): X + P"),
            Paragraph(
                "Attention by itself does not know the order of the tokens: shuffle them and every token gets "
                f"the same context vector as before. Adding a position vector to each embedding fixes that. P is {what}."
            ),
            *token_table(["position"] + component_headers(d, "p"), len(t.tokens), q, lambda i: [str(i)] + vector_cells(pos.encoding[i].tolist(), p)),
            *token_table(["token"] + component_headers(d, "x+p"), len(t.tokens), q, lambda i: [_label(t, i)] + vector_cells(s.input[i].tolist(), p), title="What attention reads: X + P"),
        )
    elif pos.name == "rope":
        n, d_k = len(t.tokens), int(s.q.shape[-1])
        q_unrotated, k_unrotated = _unrotated(s)
        keys = [token_lines(n, q, lambda j: f"k of '{_label(t, j)}' (position {j}), key head {g}: {fmt_vector(k_unrotated[g, j].tolist(), p)} → {fmt_vector(s.k[g, j].tolist(), p)}")
                for g in range(int(s.k.shape[0]))]
        doc.add(
            Heading(f"Step {step} · Rotary positions (RoPE): turn q and k"),
            Paragraph(
                "RoPE leaves X alone. Instead it turns each pair of features of a query or key by an angle that "
                f"grows with the token's position: pair i turns by pos × 10000^(-2i/{d_k - d_k % 2 if d_k % 2 else 'd_k'}). Turning both vectors makes "
                "their dot product depend on how far apart the tokens are, not on where they are. Pairs are "
                "numbered like positions: pair i is features 2i and 2i+1."
                + (
                    f" The width here, {d_k}, is odd: the last feature has no partner, so it stays as it is, as in "
                    "models that turn only part of each vector."
                    if d_k % 2
                    else ""
                )
            ),
            *token_table(["position"] + [f"pair {i}" for i in range(pos.rope_angles.shape[1])], n, q, lambda i: [str(i)] + [fmt(a, p) for a in pos.rope_angles[i].tolist()], title="Angles in radians"),
            Lines(
                [f"q of '{_label(t, q)}', head {h}: {fmt_vector(q_unrotated[h, q].tolist(), p)} → {fmt_vector(s.q[h, q].tolist(), p)}" for h in range(s.n_heads)]
                + [line for lines, _ in keys for line in lines]
            ),
        )
        if keys[0][1]:
            doc.add(left_out_line(keys[0][1], what="keys"))
        if pos.distance_check is not None:
            # Group the trace's records by distance, in the order they come; nothing is recomputed here.
            groups: dict[int, list] = {}
            for row in pos.distance_check:
                groups.setdefault(row.distance, []).append(row)
            parts = []
            for distance, rows in groups.items():
                where = ", ".join(f"({r.i}, {r.j})" for r in rows)
                shown = {fmt(r.score, p) for r in rows}
                if len(rows) == 1:
                    parts.append(f"distance {distance}, at {where}, gives {fmt(rows[0].score, p)}")
                elif len(shown) == 1:
                    parts.append(f"distance {distance} gives {shown.pop()} at each of {where}")  # the usual case
                else:
                    gap = max(r.score for r in rows) - min(r.score for r in rows)
                    parts.append(f"distance {distance} gives the same score at {where} up to rounding (they differ by {gap:.1e})")
            key = pos.distance_check_key
            scaled = t.sections["inputs"].variant not in UNSCALED
            doc.add(
                Table(
                    ["q at i", "k at j", "distance i - j", "score q'·k'"],
                    [[str(r.i), str(r.j), str(r.distance), fmt(r.score, p)] for r in pos.distance_check],
                    title=f"The same q ('{_label(t, q)}', head 0) and k ('{_label(t, key)}', key head {s.kv_head_of[0]}) moved to other positions",
                    numeric_from=0,
                ),
                Paragraph(
                    f"Only the distance matters: {'; '.join(parts)}. The score q'·k' here is the plain dot product "
                    f"of the turned vectors{', before the division by √d_k' if scaled else ''}."
                ),
            )
    else:
        slopes = ", ".join(fmt(slope, 6) for slope in pos.alibi_slopes.tolist())
        doc.add(
            Heading(f"Step {step} · ALiBi: a distance penalty on the scores"),
            Paragraph(
                "ALiBi adds no vectors. It subtracts slope × distance from every score, so far-away tokens need a "
                "clearly higher score to get the same weight. Each head has its own slope (for H a power of two, "
                "the geometric sequence 2^(-8/H), 2^(-16/H), ..., 2^(-8)), so some heads look close by and others far."
            ),
            Lines([f"slopes: {slopes}"] + [f"bias for '{_label(t, q)}', head {h}: {fmt_vector(pos.alibi_bias[h, q].tolist(), p)}" for h in range(s.n_heads)]),
        )


def projections_step(doc: Document, t: AttentionTrace, p: int, step: int) -> None:
    s, projections, seed = t.steps, t.section("projections"), t.sections["inputs"].seed
    d = t.embeddings.shape[1]
    n_heads, n_kv_heads, d_k = s.n_heads, int(s.k.shape[0]), int(s.q.shape[-1])
    heads = f"{n_heads} head{'s' if n_heads > 1 else ''} × d_k = {d_k}"
    doc.add(
        Heading(f"Step {step} · Projections: Q = X W_q, K = X W_k, V = X W_v"),
        Paragraph(
            "In the seed each token's vector plays three parts at once: what it looks for (query), what it offers "
            "to be found by (key), and what it hands over (value). Three weight matrices give each part its own "
            f"view of the embedding. W_q is {d} × {n_heads * d_k} ({heads}); W_k and W_v are "
            f"{d} × {n_kv_heads * d_k}."
            + (" Heads are numbered like the tokens, the first is head 0, as in the code, the JSON and the --head option." if n_heads > 1 else "")
        ),
        Note(
            f"These weights are untrained: drawn from N(0, 1/{d}) with seed {seed}. A trained model learns them, so "
            "the patterns below show the arithmetic, not meaning."
        ),
    )
    weights = (("W_q", projections.w_q), ("W_k", projections.w_k), ("W_v", projections.w_v))
    if d > MAX_SHOWN_DIMS:
        sizes = ", ".join(f"{name} {w.shape[0]} × {w.shape[1]}" for name, w in weights)
        doc.add(Paragraph(f"The matrices ({sizes}) are too big to print here; --format json has every entry."))
        weights = ()
    else:
        doc.add(Paragraph("Each row of a matrix is named after the component of x it multiplies: x W = x1 · (row x1) + x2 · (row x2) + ..."))
    for name, w in weights:
        doc.add(Table([name] + component_headers(w.shape[1], "c"), [[row] + vector_cells(w[i].tolist(), p) for i, row in enumerate(component_headers(d, "x"))], title=f"{name} ({d} × {w.shape[1]})", numeric_from=1))
    q_unrotated, k_unrotated = _unrotated(s)
    for h, g in enumerate(s.kv_head_of):
        title = f"Head {h}" + (f" (key/value head {g})" if n_kv_heads != n_heads else "")
        # Before any rotation: RoPE is the next step.
        doc.add(*token_table(
            ["token", "q", "k", "v"], len(t.tokens), t.query.index,
            lambda j: [_label(t, j), fmt_vector(q_unrotated[h, j].tolist(), p), fmt_vector(k_unrotated[g, j].tolist(), p), fmt_vector(s.v[g, j].tolist(), p)],
            title=title,
        ))
    if n_kv_heads != n_heads:
        doc.add(
            Paragraph(
                f"Grouped-query attention: {n_heads} query heads share {n_kv_heads} key/value heads, "
                f"{n_heads // n_kv_heads} query heads to each. The key/value cache is "
                f"{n_heads // n_kv_heads}× smaller than with one key/value head per query head."
            )
        )


def mask_step(doc: Document, t: AttentionTrace, p: int, step: int) -> None:
    s = t.steps
    labels = [_label(t, j) for j in range(len(t.tokens))]
    doc.add(
        Heading(f"Step {step} · Causal mask: no looking ahead"),
        Paragraph(
            "A model that writes text one token at a time cannot see the tokens it has not written yet. The mask "
            "lets the token at position i attend to positions 0..i only: every later score is set to -inf before the softmax, and "
            "exp(-inf) = 0, so those tokens get exactly zero weight. The rows still add up to 1."
        ),
    )
    allowed, scores = s.allowed.tolist(), s.masked[0].tolist()
    doc.add(
        *token_matrix("may attend", labels, lambda i, j: "✓" if allowed[i][j] else "·", t.query.index),
        *token_matrix("scores", labels, lambda i, j: fmt(scores[i][j], p), t.query.index,
                      title=f"Scores{' of head 0' if s.n_heads > 1 else ''} (scaled by 1/√d_k, see the next step) after the mask"),
    )


def head_step(doc: Document, t: AttentionTrace, p: int, step: int, h: int) -> None:
    s, variant = t.steps, t.sections["inputs"].variant
    alibi_bias, weights_unscaled = t.sections["positional"].alibi_bias, t.sections["scaling"].weights_unscaled
    projected, scaled, d_k = t.section("projections") is not None, variant not in UNSCALED, int(s.q.shape[-1])
    q, n = t.query.index, len(t.tokens)
    qlabel = _label(t, q)
    head = f" · head {h}" if variant in MULTI_HEAD else ""
    doc.add(Heading(f"Step {step} · Scores and softmax for '{qlabel}'{head}", level=1 if h == 0 else 2))
    if h == 0:
        what = "q · k_j" if projected else "x_q · x_j"
        division = f"Then each score is divided by √d_k = √{d_k} = {fmt(math.sqrt(d_k), p)}." if scaled else "The seed does not scale the scores."
        doc.add(Paragraph(f"The score of token j is {what}. {division}"))
    g = s.kv_head_of[h]
    keys, query_vec = s.k[g], s.q[h, q]
    if d_k <= TERMS_SHOWN_UP_TO_DIM:
        width = max(len(_label(t, j)) for j in range(n))
        lines = [
            f"{_label(t, j) + ':':<{width + 1}} " + " + ".join(f"{fmt(a, p)}×{fmt(b, p)}" for a, b in zip(query_vec.tolist(), keys[j].tolist()))
            + f" = {fmt(s.scores[h, q, j], p)}"
            for j in range(n)
        ]
        doc.add(Lines(lines))
    columns, headers = [s.scores[h, q]], ["q·k" if projected else "x_q·x_j"]
    if scaled:
        columns.append(s.scaled[h, q])
        headers.append(f"÷ √{d_k}")
    if s.allowed is not None or alibi_bias is not None:
        columns.append(s.masked[h, q])
        headers.append("+ mask" if alibi_bias is None else "+ bias" if s.allowed is None else "+ bias, mask")
    columns += [s.exp[h, q]] + ([weights_unscaled[h, q]] if scaled else []) + [s.weights[h, q]]
    headers += ["exp(s - m)"] + (["α unscaled"] if scaled else []) + ["α"]
    doc.add(Table(["token"] + headers, _rows(t, p, columns), highlight_row=q))
    lines = [f"m = {fmt(s.row_max[h, q], p)}   sum of exp(s - m) = {fmt(s.exp_sum[h, q], p)}   sum of α = {fmt(s.weights[h, q].sum(), p)}"]
    if scaled:
        lines.append(
            f"largest weight: {fmt(weights_unscaled[h, q].max(), p)} unscaled, {fmt(s.weights[h, q].max(), p)} scaled; "
            f"entropy {entropy(weights_unscaled[h, q]):.3f} vs {entropy(s.weights[h, q]):.3f} nats "
            f"(uniform would be {math.log(int(s.allowed[q].sum()) if s.allowed is not None else n):.3f})"
        )
    lines.append(f"head output z = Σ α_j v_j = {fmt_vector(s.context[h, q].tolist(), p)}")
    doc.add(Lines(lines))
    order = sorted(range(n), key=lambda j: -float(s.weights[h, q, j]))
    top = ", ".join(f"'{_label(t, j)}' {100 * float(s.weights[h, q, j]):.{max(p - 2, 0)}f}%" for j in order[:3])
    doc.add(Paragraph(f"'{qlabel}' puts the most weight on {top}."))
    if scaled and h == 0:
        doc.add(*scaling_section(t, p))


def output_step(doc: Document, t: AttentionTrace, p: int, step: int) -> None:
    s, multihead = t.steps, t.section("multihead")
    n, q = len(t.tokens), t.query.index
    labels = [_label(t, j) for j in range(n)]
    doc.add(Heading(f"Step {step} · Every token as the query, all at once"))
    for h in range(s.n_heads):
        name = "A" if s.n_heads == 1 else f"A head {h}"
        weights = s.weights[h].tolist()
        doc.add(*token_matrix(name, labels, lambda i, j: fmt(weights[i][j], p), q, title=f"Weights ({n} × {n}): {QUERY_KEY_AXES}; every row adds up to 1"))
    if t.section("projections") is not None:
        doc.add(*untrained_note(t))
    if multihead is not None:
        count, d_v = s.n_heads, s.context.shape[-1]
        heads = ", ".join(f"head_{h}" for h in range(count)) if count <= 3 else f"head_0, ..., head_{count - 1}"
        laid = (
            f"The {count} head outputs (each {d_v} wide) are laid side by side into one vector of {multihead.concat.shape[-1]}"
            if count > 1
            else f"The head's output ({d_v} wide) is the whole concatenation"
        )
        doc.add(
            Paragraph(
                f"{laid}, and W_o ({multihead.w_o.shape[0]} × {multihead.w_o.shape[1]}, untrained) mixes "
                f"{'them' if count > 1 else 'it'} back to the model width: output = concat({heads}) W_o."
            ),
            Lines([f"concat for '{labels[q]}': {fmt_vector(multihead.concat[q].tolist(), p)}", f"output:            {fmt_vector(s.output[q].tolist(), p)}"]),
        )
    width = s.output.shape[-1]
    doc.add(
        *token_table(["Z"] + component_headers(width, "z"), n, q, lambda i: [labels[i]] + vector_cells(s.output[i].tolist(), p), title=f"Outputs ({n} × {width})"),
        Heading("Summary: each token before and after attention", level=2),
        *token_table(["token", "input", "output"], n, q, lambda i: [labels[i], fmt_vector(s.input[i].tolist(), p), fmt_vector(s.output[i].tolist(), p)], numeric_from=3),
    )
