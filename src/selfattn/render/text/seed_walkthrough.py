"""The seed's walkthrough, step by step, as a Document built from the record (``AttentionTrace``).

All numbers come from the record; nothing here computes attention. The prose is ours.
"""

from __future__ import annotations

from selfattn.render.text.document import (
    QUERY_KEY_AXES,
    Document,
    Heading,
    Lines,
    Note,
    Paragraph,
    Table,
    component_headers,
    display_token,
    fmt,
    fmt_vector,
    token_matrix,
    token_table,
    vector_cells,
)
from selfattn.trace.record import AttentionTrace

FLOAT32_EXP_LIMIT = 88.72  # exp(x) is inf in float32 above ln(3.4e38) ~ 88.72
TERMS_SHOWN_UP_TO_DIM = 4  # dot products are written out term by term up to this width


def seed_steps(doc: Document, trace: AttentionTrace, precision: int) -> None:
    """Steps 3 to 5 of the seed's walk of its query (scores, softmax, context), then all queries at once."""
    _query_scores(doc, trace, precision)
    _softmax(doc, trace, precision)
    _context(doc, trace, precision)
    _all_at_once(doc, trace, precision)


def _label(trace: AttentionTrace, i: int) -> str:
    return display_token(trace.tokens[i])


def _math(i: int) -> str:
    return f"x^({i + 1})"


def tokens_step(doc: Document, tokens: list[str], q: int, math_notation: bool = True) -> None:
    """Step 1: the tokens and their 0-based positions, the query marked; the seed's x^(i) beside them if asked."""
    intro = (
        f"The sentence is cut at every space, so each word is one token: {len(tokens)} in all. "
        "Case counts, so 'The' and 'the' are different tokens. "
    )
    if not math_notation:  # the variants write x_q and x_j, so only the code's numbering is needed
        doc.add(
            Heading("Step 1 · Tokens"),
            Paragraph(intro + "Positions count from 0, as --query, --head and the JSON do."),
            Table(
                ["position", "token", ""],
                [[str(i), display_token(t), "← query" if i == q else ""] for i, t in enumerate(tokens)],
                highlight_row=q,
                numeric_from=3,
            ),
        )
        return
    doc.add(
        Heading("Step 1 · Tokens"),
        Paragraph(
            intro + "Two numbering schemes meet here: Python counts positions from 0, the formulas "
            "count from 1. Token i in the code is x^(i+1) in the maths."
        ),
        Table(
            ["code index", "math index", "token", ""],
            [
                [str(i), _math(i), display_token(t), "← query" if i == q else ""]
                for i, t in enumerate(tokens)
            ],
            highlight_row=q,
            numeric_from=4,
        ),
    )


def embeddings_step(doc: Document, tokens: list[str], x, source, q: int, p: int, math_notation: bool = True) -> None:
    """Step 2: the embedding table X, where it came from, and whether it was learned (with the seed's x^(i) if asked)."""
    n, d = x.shape
    doc.add(Heading(f"Step 2 · Embeddings: X is {n} × {d}"))
    doc.add(
        Paragraph(
            f"Each token becomes a vector of {d} numbers, one row of X. These vectors come from "
            f"{source.description}."
        )
    )
    if source.note:
        doc.add(Note(source.note.capitalize() + "."))
    if not source.trained:
        doc.add(
            Note(
                "None of these vectors was learned, so any pattern in the weights below is arithmetic, "
                "not meaning. A trained model learns its vectors from data."
            )
        )
    if not math_notation:
        doc.add(*token_table(["token"] + component_headers(d), n, q,
                             lambda i: [display_token(tokens[i])] + vector_cells(x[i].tolist(), p)))
        return
    doc.add(*token_table(["token", ""] + component_headers(d), n, q,
                         lambda i: [display_token(tokens[i]), _math(i)] + vector_cells(x[i].tolist(), p), numeric_from=2))


def _query_scores(doc: Document, trace: AttentionTrace, p: int) -> None:
    qt = trace.sections["seed"]
    q, xq = qt.index, _math(qt.index)
    doc.add(
        Heading(f"Step 3 · Scores for the query '{_label(trace, q)}' ({xq}, code index {q})"),
        Paragraph(
            f"The query compares itself with every token, itself included. The comparison is a dot "
            f"product: multiply the two vectors component by component and add the products. "
            f"ω_{q + 1}j = {xq} · x^(j). The more two vectors point the same way, the larger the score."
        ),
        Paragraph("One dot product at a time, as a loop over the tokens:"),
    )
    lines = []
    for j in range(len(trace.tokens)):
        name = f"ω_{q + 1},{j + 1}"
        if int(trace.embeddings.shape[1]) <= TERMS_SHOWN_UP_TO_DIM:
            terms = " + ".join(
                f"{fmt(a, p)}×{fmt(b, p)}"
                for a, b in zip(trace.embeddings[q].tolist(), trace.embeddings[j].tolist())
            )
        else:
            terms = f"{xq} · {_math(j)}"
        lines.append(f"{name} = {terms} = {fmt(qt.scores_loop[j], p)}   ({_label(trace, j)})")
    doc.add(Lines(lines))
    doc.add(
        Paragraph(f"All of them at once, as one matrix-vector product ω = X {xq}:"),
        Lines([f"ω = {fmt_vector(qt.scores.tolist(), p)}"]),
        Paragraph(f"Largest difference between the loop and the matrix product: {qt.scores_loop_vs_matrix:.1e}."),
    )


def _per_token_table(trace: AttentionTrace, p: int, headers: list[str], columns: list) -> Table:
    """One row per token, one column per (n,) tensor, the query's row highlighted."""
    rows = [[_label(trace, j)] + [fmt(col[j], p) for col in columns] for j in range(len(trace.tokens))]
    return Table(["token"] + headers, rows, highlight_row=trace.query.index)


def _softmax(doc: Document, trace: AttentionTrace, p: int) -> None:
    qt = trace.sections["seed"]
    q = qt.index
    doc.add(
        Heading("Step 4 · Softmax: from scores to weights"),
        Paragraph(
            "Scores can be any size and any sign. Softmax turns them into weights that are all positive "
            "and add up to 1: raise e to each score, add those up, and divide each one by the total. "
            "Because of the exponential, a score a little higher than the rest gets a clearly larger weight."
        ),
        _per_token_table(
            trace, p, ["ω", "exp(ω)", "α = exp(ω) / sum", "ω / Σω"], [qt.scores, qt.exp, qt.weights_naive, qt.plain_division]
        ),
        Lines(
            [
                f"sum of exp(ω) = {fmt(qt.exp_sum, p)}",
                f"sum of α      = {fmt(qt.weights_naive.sum(), p)}",
                f"sum of ω      = {fmt(qt.scores_sum, p)}",
            ]
        ),
        _plain_division(trace, p),
        Heading("The stable form", level=2),
        Paragraph(
            f"exp grows very fast: in float32 it overflows to inf once a score passes about "
            f"{FLOAT32_EXP_LIMIT}, and inf / inf is NaN. The cure is to subtract the largest score m from "
            "every score first. That multiplies the top and the bottom of each fraction by the same "
            "factor exp(-m), so the weights do not change, but now the largest exponential is exp(0) = 1. "
            "selfattn always uses this form."
        ),
        _per_token_table(trace, p, ["ω - m", "exp(ω - m)", "α"], [qt.shifted, qt.exp_shifted, qt.weights]),
        Lines(
            [
                f"m = max ω = {fmt(qt.max, p)}",
                f"sum of exp(ω - m) = {fmt(qt.exp_shifted_sum, p)}",
                f"sum of α = {fmt(qt.weights.sum(), p)}",
            ]
        ),
    )
    if qt.naive_overflows:
        doc.add(
            Note(
                "On these scores the naive form breaks down: exp overflowed to inf or every exponential "
                "underflowed to 0, so its weights are NaN. The stable weights are the correct ones.",
                warning=True,
            )
        )
    else:
        doc.add(Paragraph(f"Largest difference between the naive and the stable weights: {qt.naive_vs_stable:.1e}."))
    order = sorted(range(len(trace.tokens)), key=lambda j: -float(qt.weights[j]))
    top = ", ".join(f"'{_label(trace, j)}' {100 * float(qt.weights[j]):.{max(p - 2, 0)}f}%" for j in order[:3])
    doc.add(Paragraph(f"'{_label(trace, q)}' puts the most weight on {top}."))


def _plain_division(trace: AttentionTrace, p: int) -> Paragraph | Note:
    """Why not ω / Σω: what plain division gives on these scores, and when it breaks."""
    qt = trace.sections["seed"]
    fails = qt.plain_division_fails
    rule = (
        "The last column, ω / Σω, is the plain way to make scores add up to 1. It fails where softmax "
        "cannot, because exp(ω) > 0: a negative score gets a negative weight, a sum of 0 divides by zero, "
        "and a negative sum turns the order round."
    )
    if not fails:
        q = qt.index
        return Paragraph(
            f"{rule} Here every score is positive, so it works: "
            f"'{_label(trace, q)}' gets {fmt(qt.plain_division[q], p)}, softmax {fmt(qt.weights[q], p)}."
        )
    said = []
    if "zero sum" in fails:
        said.append(f"the scores add up to {fmt(qt.scores_sum, p)}, so every ω / Σω is inf, -inf or nan")
    if "negative weight" in fails:
        j = int(qt.plain_division.argmin())
        said.append(f"'{_label(trace, j)}' gets {fmt(qt.plain_division[j], p)}, a negative weight")
    if "negative sum" in fails:
        j = int(qt.plain_division.argmax())
        said.append(
            f"the scores add up to {fmt(qt.scores_sum, p)} < 0, so the largest plain weight, "
            f"{fmt(qt.plain_division[j], p)}, goes to '{_label(trace, j)}' (score {fmt(qt.scores[j], p)})"
        )
    return Note(f"{rule} On these scores plain division breaks: " + "; ".join(said) + ".", warning=True)


def _context(doc: Document, trace: AttentionTrace, p: int) -> None:
    qt = trace.sections["seed"]
    q, n, d = qt.index, len(trace.tokens), int(trace.embeddings.shape[1])
    doc.add(
        Heading(f"Step 5 · The context vector z^({q + 1})"),
        Paragraph(
            f"The new vector for '{_label(trace, q)}' is a blend of all the token vectors, each scaled by its "
            f"weight: z^({q + 1}) = Σ_j α_{q + 1}j x^(j). A token with a larger weight pulls the blend "
            "closer to its own vector."
        ),
        Table(
            ["token", "α"] + component_headers(d, "α·x"),
            [[_label(trace, j), fmt(qt.weights[j], p)] + vector_cells(qt.context_terms[j].tolist(), p) for j in range(n)],
            highlight_row=q,
        ),
        Lines(
            [
                f"adding the rows one by one:  z^({q + 1}) = {fmt_vector(qt.context_loop.tolist(), p)}",
                f"as one product α X:          z^({q + 1}) = {fmt_vector(qt.context.tolist(), p)}",
                f"largest difference: {qt.context_loop_vs_matrix:.1e}",
                f"before attention: {_math(q)} = {fmt_vector(trace.embeddings[q].tolist(), p)}",
            ]
        ),
    )


def _all_at_once(doc: Document, trace: AttentionTrace, p: int) -> None:
    n, d, q = len(trace.tokens), int(trace.embeddings.shape[1]), trace.query.index
    head = trace.steps  # the seed's one head: scores Ω = X Xᵀ, weights A, context Z = A X
    context = head.context[0]
    labels = [_label(trace, i) for i in range(n)]
    doc.add(
        Heading("Step 6 · Every token as the query, all at once"),
        Paragraph(
            "Each token takes its turn as the query. Stacking all the queries turns the products into "
            "matrix products: the scores are Ω = X Xᵀ, softmax runs along each row, and the context "
            "vectors are Z = A X. In code that is three lines: scores = X @ X.T; "
            "weights = softmax(scores, dim=-1); Z = weights @ X."
        ),
    )
    scores, weights = head.scores[0].tolist(), head.weights[0].tolist()
    row_sums = head.weights[0].sum(dim=-1)
    # Rows are named by their token, never by a number: the query's row is named by both
    # numberings at once (code index and the maths' x^(i)), as step 1 introduced them.
    query_row = f"the row of '{labels[q]}' (code index {q}, x^({q + 1}) in the maths)"
    doc.add(
        *token_matrix("Ω = X Xᵀ", labels, lambda i, j: fmt(scores[i][j], p), q,
                      title=f"Scores ({n} × {n}): {QUERY_KEY_AXES}"),
        *token_matrix("A = softmax(Ω)", labels, lambda i, j: fmt(weights[i][j], p), q,
                      title=f"Weights ({n} × {n}): {QUERY_KEY_AXES}; every row adds up to 1",
                      extra=[("row sum", lambda i: fmt(row_sums[i], p))]),
        *token_table(["Z = A X"] + component_headers(d, "z"), n, q,
                     lambda i: [labels[i]] + vector_cells(context[i].tolist(), p),
                     title=f"Context vectors ({n} × {d}), one row per query: {query_row} is the z^({q + 1}) of step 5"),
        Heading("Summary: each token before and after attention", level=2),
        *token_table(["token", "embedding x", "context z"], n, q,
                     lambda i: [labels[i], fmt_vector(trace.embeddings[i].tolist(), p), fmt_vector(context[i].tolist(), p)],
                     numeric_from=3),
    )
