"""The walkthrough of one head of a pretrained model, as a Document built from a ModelTrace.

The same steps as the seed's (tokens, embeddings, scores, softmax, context), on the
learned numbers of a real model: WordPiece tokens, 384-wide embeddings, one head's
32-wide queries, keys and values. Vectors this wide are shown by their first and last
components and their length. All numbers come from the trace; nothing here computes
attention.
"""

from __future__ import annotations

import math

import torch

from selfattn.config import check_precision
from selfattn.explain.document import (
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
    vector_cells,
)
from selfattn.models.model_trace import SPECIAL_TOKENS, ModelTrace

TOP_SHOWN = 3  # tokens named in "puts the most weight on"
SPECIAL_SHARE_NOTED = 0.25  # above this share of weight on [CLS]/[SEP], say why
SPLIT_WORDS_SHOWN = 3  # words cut into "##" pieces named in the tokens step


def model_walkthrough(t: ModelTrace, precision: int = 4) -> Document:
    """Every step of layer ``t.layer``, head ``t.head`` for the query, in reading order."""
    check_precision(precision)
    p = precision
    doc = Document()
    _intro(doc, t)
    _tokens(doc, t)
    _embeddings(doc, t, p)
    step = 3
    if t.layer > 0:
        _layer_input(doc, t, p, step)
        step += 1
    _projections(doc, t, p, step)
    _softmax(doc, t, p, step + 1)
    _context(doc, t, p, step + 2)
    _after_the_head(doc, t, p)
    return doc


def _label(t: ModelTrace, j: int) -> str:
    return display_token(t.tokens[j])


def _query(t: ModelTrace) -> str:
    return f"'{_label(t, t.query_index)}'"


def _norm(vector: torch.Tensor) -> float:
    """|x|, the length of a vector: a one-number summary of a wide vector, for display."""
    return float(vector.double().norm())


def _wide_rows(t: ModelTrace, vectors: torch.Tensor, p: int) -> list[list[str]]:
    """One row per token: its label, the first and last components, then the length."""
    return [[_label(t, j)] + vector_cells(vectors[j].tolist(), p) + [fmt(_norm(vectors[j]), 2)] for j in range(len(t.tokens))]


def _intro(doc: Document, t: ModelTrace) -> None:
    doc.add(
        Paragraph(
            f"Model {t.model_name}: a BERT encoder with {t.n_layers} layers of {t.n_heads} attention heads. "
            f"Every token is a vector of {t.d_model} numbers, and each head works on {t.head_dim} of them "
            f"({t.n_heads} × {t.head_dim} = {t.d_model})."
        ),
        Note(
            "Every weight here was learned from data (this model was trained to place sentences with similar "
            "meaning close together), unlike the seed's hand-made table or the variants' random weights. So the "
            "patterns below are what a real model does, not arithmetic on made-up numbers."
        ),
        Paragraph(
            f"This walkthrough follows layer {t.layer}, head {t.head}, with {_query(t)} (position {t.query_index}) "
            f"as the query. Layers, heads and positions count from 0, as everywhere in selfattn: the model's "
            f"{t.n_layers} layers are layers 0 to {t.n_layers - 1} and its {t.n_heads} heads are heads 0 to {t.n_heads - 1}."
        ),
    )


def _split_words(tokens: list[str]) -> list[tuple[str, list[str]]]:
    """Words the tokenizer cut into pieces: (the word, its pieces), in order."""
    words: list[list[str]] = []
    for token in tokens:
        if token.startswith("##") and words:
            words[-1].append(token)  # continues the word before it
        else:
            words.append([token])
    return [("".join(piece.removeprefix("##") for piece in pieces), pieces) for pieces in words if len(pieces) > 1]


def _tokens(doc: Document, t: ModelTrace) -> None:
    n, q = len(t.tokens), t.query_index
    text = (
        f"The model cuts the text with its own WordPiece tokenizer: {n} tokens here. It lower-cases the text "
        "(and drops accents), splits off punctuation, and cuts a word that is not in its vocabulary into pieces "
        "that are; a piece starting with '##' continues the word before it. It also adds two tokens of its own: "
        "[CLS] at the front and [SEP] at the end. Each token has an id, its row in the embedding table."
    )
    split = _split_words(t.tokens)
    if split:
        shown = "; ".join(f"'{display_token(word)}' became {' + '.join(display_token(piece) for piece in pieces)}" for word, pieces in split[:SPLIT_WORDS_SHOWN])
        text += f" Here {shown}."
    rows = [[str(i), _label(t, i), str(t.input_ids[i]), "← query" if i == q else ""] for i, _ in enumerate(t.tokens)]
    doc.add(Heading("Step 1 · WordPiece tokens"), Paragraph(text), Table(["position", "token", "id", ""], rows, highlight_row=q, numeric_from=2))


def _embeddings(doc: Document, t: ModelTrace, p: int) -> None:
    q, d = t.query_index, t.d_model
    names = {"word": f"word (id {t.input_ids[q]})", "position": f"position {q}", "type": "type 0"}
    order = {"word": 0, "position": 1, "type": 2}
    shown = sorted(t.embedding.parts, key=lambda part: order.get(part.name, 3))
    parts = [(names.get(part.name, part.label), part.vectors[q]) for part in shown]
    parts.append(("sum", sum(part.vectors[q] for part in shown)))  # for display; the model's sum feeds the LayerNorm
    parts.append(("LayerNorm", t.embeddings[q]))
    doc.add(
        Heading(f"Step 2 · Embeddings: word + position + type, then LayerNorm ({len(t.tokens)} × {d})"),
        Paragraph(
            f"Each token starts as the sum of three learned vectors of {d} numbers: the row of the word table for "
            "its id (what the token is), the row of the position table for its place (where it is), and a "
            "token-type vector (which of two texts it belongs to; with one text every token gets type 0). "
            "LayerNorm then rescales the sum: it subtracts the mean of its numbers, divides by their standard "
            "deviation, and applies a learned scale and shift to each component."
        ),
        Paragraph(
            f"{d} numbers do not fit on a line, so a vector is shown by its first components, '…', and its last "
            "one, and |x| is the length of the whole vector. --format json has every number."
        ),
        Table(
            [_query(t)] + component_headers(d, "x") + ["|x|"],
            [[name] + vector_cells(v.tolist(), p) + [fmt(_norm(v), 2)] for name, v in parts],
            title=f"The parts of {_query(t)}",
        ),
        Table(["token"] + component_headers(d, "x") + ["|x|"], _wide_rows(t, t.embeddings, p), title="X₀: every token after LayerNorm", highlight_row=q),
        Paragraph(
            "These vectors are what layer 0 reads"
            + (", the layer this walkthrough follows." if t.layer == 0 else f"; {_layers_before(t.layer)} {'changes' if t.layer == 1 else 'change'} them before layer {t.layer} sees them.")
        ),
    )


def _layers_before(layer: int) -> str:
    return {1: "layer 0", 2: "layers 0 and 1"}.get(layer, f"layers 0 to {layer - 1}")


def _layer_input(doc: Document, t: ModelTrace, p: int, step: int) -> None:
    before = _layers_before(t.layer)
    doc.add(
        Heading(f"Step {step} · The input of layer {t.layer}"),
        Paragraph(
            f"Layer {t.layer} does not read the embeddings themselves but what {before} made of them: each "
            "layer mixes information between the tokens (attention) and then reworks each token on its own (a "
            f"feed-forward network), so a token's vector now carries some of its context. This is X_{t.layer}, "
            f"still {len(t.tokens)} × {t.d_model}."
        ),
        Table(["token"] + component_headers(t.d_model, "x") + ["|x|"], _wide_rows(t, t.layer_input, p), title=f"X_{t.layer}: the hidden states entering layer {t.layer}", highlight_row=t.query_index),
    )


def _projections(doc: Document, t: ModelTrace, p: int, step: int) -> None:
    q, h, d_h = t.query_index, t.head, t.head_dim
    first = h * d_h
    rows = [[_label(t, j)] + vector_cells(t.k[j].tolist(), p) + [fmt(t.scores_unscaled[q, j], p)] for j in range(len(t.tokens))]
    doc.add(
        Heading(f"Step {step} · Queries and keys of head {h}: q = x W_q + b_q, k = x W_k + b_k"),
        Paragraph(
            f"Each token's vector x is projected three ways by learned {t.d_model} × {t.d_model} matrices plus a "
            "bias: the query q (what the token is looking for), the key k (what it offers to be found by) and the "
            f"value v (what it hands over). The {t.d_model} output columns are {t.n_heads} groups of {d_h}, one "
            f"group per head: head {h} uses columns {first} to {first + d_h - 1}. So in this head every q, "
            f"k and v has {d_h} numbers; v comes in at step {step + 2}."
        ),
        Lines([f"q of {_query(t)} = {fmt_vector(t.q[q].tolist(), p)}", f"|q| = {fmt(_norm(t.q[q]), p)}"]),
        Paragraph(
            f"The score of key j is the dot product q · k_j: multiply the {d_h} pairs of components and add them "
            f"up. The better key j matches what {_query(t)} is looking for, the larger its score."
        ),
        Table(["token"] + component_headers(d_h, "k") + ["q · k"], rows, title=f"Every token's key in head {h}, and its score", highlight_row=q),
    )


def _softmax(doc: Document, t: ModelTrace, p: int, step: int) -> None:
    q, n, d_h = t.query_index, len(t.tokens), t.head_dim
    columns = [t.scores_unscaled[q], t.scores[q], t.exp[q], t.weights[q]]
    rows = [[_label(t, j)] + [fmt(col[j], p) for col in columns] for j in range(n)]
    doc.add(
        Heading(f"Step {step} · Scaling and softmax for {_query(t)}"),
        Paragraph(
            f"Before the softmax every score is divided by √{d_h} = {fmt(math.sqrt(d_h), p)} (times "
            f"{fmt(t.scale, p)}). A sum of {d_h} products spreads about √{d_h} times wider than one product, "
            "and softmax over widely spread scores hands nearly all the weight to one token, where learning "
            "stalls. Then the softmax, in its stable form: subtract the largest scaled score m, take exp, and "
            "divide each by their sum. The weights α are positive and add up to 1."
        ),
        Table(["token", "q · k", f"s = q · k / √{d_h}", "exp(s - m)", "α"], rows, highlight_row=q),
        Lines([f"m = {fmt(t.row_max[q], p)}   sum of exp(s - m) = {fmt(t.exp_sum[q], p)}   sum of α = {fmt(t.weights[q].sum(), p)}"]),
    )
    order = sorted(range(n), key=lambda j: -float(t.weights[q, j]))
    decimals = max(p - 2, 0)
    top = ", ".join(f"'{_label(t, j)}' {100 * float(t.weights[q, j]):.{decimals}f}%" for j in order[:TOP_SHOWN])
    doc.add(Paragraph(f"In layer {t.layer}, head {t.head}, {_query(t)} puts the most weight on {top}."))
    special = [j for j in range(n) if t.tokens[j] in SPECIAL_TOKENS and j != q]
    share = float(sum(float(t.weights[q, j]) for j in special))
    if share >= SPECIAL_SHARE_NOTED:
        doc.add(
            Note(
                f"{100 * share:.{decimals}f}% of the weight goes to {' and '.join(sorted({t.tokens[j] for j in special}))}. "
                "Trained heads often do this "
                "when what they look for is not in the sentence: the special tokens are always there, so they "
                "serve as a place to park weight, a way for the head to change the token very little."
            )
        )


def _context(doc: Document, t: ModelTrace, p: int, step: int) -> None:
    q, d_h = t.query_index, t.head_dim
    rows = [[_label(t, j), fmt(t.weights[q, j], p)] + vector_cells(t.v[j].tolist(), p) for j in range(len(t.tokens))]
    doc.add(
        Heading(f"Step {step} · Head {t.head}'s output for {_query(t)}: z = Σ α_j v_j"),
        Paragraph(
            f"The head hands back a blend of the value vectors, each scaled by its weight: {d_h} numbers for "
            f"{_query(t)}. Tokens with a large α pull the blend towards their own v."
        ),
        Table(["token", "α"] + component_headers(d_h, "v"), rows, title=f"Every token's value in head {t.head}", highlight_row=q),
        Lines([f"z of {_query(t)} = {fmt_vector(t.context[q].tolist(), p)}", f"|z| = {fmt(_norm(t.context[q]), p)}"]),
    )


def _shell_quoted(sentence: str) -> str:
    """The sentence quoted so a shell passes it unchanged, or a placeholder when that is not simple."""
    if len(sentence) > 60 or not sentence.isprintable():
        return '"your sentence"'
    if not any(c in sentence for c in '"$`\\!'):
        return f'"{sentence}"'
    if "'" not in sentence:
        return f"'{sentence}'"  # nothing expands inside single quotes
    return '"your sentence"'


def _after_the_head(doc: Document, t: ModelTrace, p: int) -> None:
    q, layer = t.query_index, t.layer
    last = layer == t.n_layers - 1
    result = (
        "the model's final vectors; for a sentence embedding, the model averages them over the tokens "
        "(see selfattn similarity)"
        if last
        else f"the input of the next layer, layer {layer + 1}"
    )
    doc.add(
        Heading(f"After head {t.head}: the rest of layer {layer}"),
        Paragraph(
            f"Head {t.head} is one of {t.n_heads} heads that run side by side on the same input, each with its "
            f"own {t.head_dim} columns of W_q, W_k and W_v, so each can look for something else. Their "
            f"{t.n_heads} outputs of {t.head_dim} numbers are laid side by side into {t.d_model}, multiplied by "
            f"W_o ({t.d_model} × {t.d_model}), added to the layer's input (the residual connection) and "
            "normalised by LayerNorm. Then a feed-forward network reworks each token on its own (widen, GELU, "
            f"narrow back), with another residual add and LayerNorm. The result is layer {layer}'s output, {result}."
        ),
        Lines([f"layer {layer}'s output for {_query(t)} = {fmt_vector(t.layer_output[q].tolist(), p)}"]),
        Paragraph(
            "Heads differ a lot: some look at the token before or after, some at [CLS] and [SEP], some spread "
            f"their weight widely. To see what all {t.n_layers * t.n_heads} heads do on this sentence, run"
        ),
        Lines([f"selfattn heads {_shell_quoted(t.sentence)}"]),
        Paragraph("then pick one and come back with --layer and --head. --format json has every number of this walkthrough."),
    )
