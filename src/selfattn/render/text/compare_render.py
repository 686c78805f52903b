"""`selfattn compare`: a Comparison as text, markdown or JSON.

The numbers come from ``selfattn.analysis.comparison.compare``; this module only lays them out:
one table with a row per layer and head (the query's top three keys and the entropy of
its row in each sentence), and for a model the query's cosine after each layer and (for
an encoder) the two sentences' similarity. A model's tokens are shown as they read
('␣cat' for 'Ġcat'); JSON keeps the vocabulary's own spelling beside the readable one,
and every number at full precision.
"""

from __future__ import annotations

import shlex
from typing import Any, TextIO

from selfattn.analysis.comparison import AttendedToken, Comparison, HeadComparison
from selfattn.render.text.command_output import check_output, shorten, write_document, write_json
from selfattn.render.text.document import (
    Document,
    Heading,
    Lines,
    Note,
    Paragraph,
    Table,
    display_token,
    fmt,
)
from selfattn.render.visual.token_labels import token_label


def render_comparison(comparison: Comparison, output_format: str, precision: int, stream: TextIO) -> None:
    """Write ``comparison`` to ``stream`` as "text", "markdown" or "json" (full precision).

    Args:
        comparison: what ``selfattn.compare`` returned.
        output_format: "text", "markdown" or "json".
        precision: decimals of the weights and entropies in text and markdown, 0 to 10;
            cosines get one more. JSON keeps every digit.
        stream: where to write.

    Raises:
        OptionError: an unknown format or a precision out of range.
    """
    check_output(output_format, precision)
    if output_format == "json":
        write_json(comparison_to_dict(comparison), stream)
        return
    title = f"Comparing {quoted(comparison)} in two sentences" + (f" with {comparison.model}" if comparison.model else "")
    write_document(comparison_document(comparison, precision), title, output_format, stream)


def comparison_to_dict(c: Comparison) -> dict[str, Any]:
    """The JSON object: sentences, query, heads and, for a model, token_cosine and similarity.

    Args:
        c: the comparison.

    Returns:
        A dict of plain numbers, strings and lists; layers, heads and indices count from 0.
    """
    data: dict[str, Any] = {
        "model": c.model,
        "variant": c.variant,
        "sentences": list(c.sentences),
        "tokens": [c.tokens_a, c.tokens_b],
        "query": {"token": c.token_a if c.token_a == c.token_b else f"{c.token_a} / {c.token_b}",
                  "index_a": c.index_a, "index_b": c.index_b, "token_a": c.token_a, "token_b": c.token_b},
        "n_layers": c.n_layers,
        "n_heads": c.n_heads,
        "heads": [head_to_dict(h) for h in c.heads],
    }
    if c.model is None:
        data["embedding_source"] = c.source
    else:
        data["readable"] = [c.readable_a, c.readable_b]
        data["attention"] = {"causal": c.attention.causal, "positional": c.attention.positional,
                             "n_kv_heads": c.attention.n_kv_heads}
        data["token_cosine"] = list(c.token_cosine)
        data["similarity"] = c.similarity
    if c.notes:
        data["notes"] = list(c.notes)
    return data


def head_to_dict(h: HeadComparison) -> dict[str, Any]:
    def top(entries: tuple[AttendedToken, ...]) -> list[dict[str, Any]]:
        return [{"token": e.token, "index": e.index, "weight": e.weight}
                | ({} if e.readable is None else {"readable": e.readable}) for e in entries]

    return {"layer": h.layer, "head": h.head, "top_a": top(h.top_a), "top_b": top(h.top_b),
            "entropy_a": h.entropy_a, "entropy_b": h.entropy_b}


def comparison_document(c: Comparison, precision: int) -> Document:
    """The side-by-side table, then (for a model) the cosines and the similarity, then a short summary.

    Args:
        c: the comparison.
        precision: decimals of the weights and entropies; cosines get one more.

    Returns:
        The ``Document`` for the text and markdown renderers.
    """
    doc = Document()
    rows = [[label, display_token(shorten(sentence)), str(len(tokens)), f"{shown_token(c, tokens, index, readable)} #{index}"]
            for label, sentence, tokens, index, readable in (("A", c.sentences[0], c.tokens_a, c.index_a, c.readable_a),
                                                             ("B", c.sentences[1], c.tokens_b, c.index_b, c.readable_b))]
    doc.add(Table(["", "sentence", "tokens", "query"], rows, numeric_from=2))
    doc.add(Paragraph(f"Attention: {describe(c)}."))
    first = c.tokens_a[0] if c.tokens_a and c.tokens_a[0] in c.special_tokens else None
    spaces = c.readable_a is not None and any(r != t for r, t in zip(c.readable_a + c.readable_b, c.tokens_a + c.tokens_b))
    doc.add(Paragraph(
        "How to read it: each row is one head. For the query it lists the three tokens it puts the most "
        "weight on in each sentence, as token #index weight, and the entropy H of its row of weights in "
        "bits (0: all the weight on one token; log2 n: spread evenly over n tokens). Indices, layers and "
        "heads count from 0" + (f" ({first} is token 0)." if first else ".")
        + (" Tokens are shown as they read, ␣ for the space a token starts with; --format json also gives "
           "the vocabulary's own spelling." if spaces else "")
    ))
    rows = [
        [str(h.layer), str(h.head), top_cell(h.top_a, precision), top_cell(h.top_b, precision),
         fmt(h.entropy_a, precision), fmt(h.entropy_b, precision)]
        for h in c.heads
    ]
    doc.add(Table(["layer", "head", "top 3 in A", "top 3 in B", "H_A", "H_B"], rows, numeric_from=4))
    for note in c.notes:
        doc.add(Note(note, c.model is None))  # a model's notes say how to read it; the toy's warn
    if c.model is not None:
        _model_part(doc, c, precision + 1)
    else:
        doc.add(Note(
            "the toy embeddings give a token the same vector in every sentence, so what differs between A and "
            "B comes from the other tokens" + (f" and the positions ({c.positional})." if c.positional != "none" else ".")
        ))
    doc.add(Heading("Summary"), *summary(c, precision))
    return doc


def _model_part(doc: Document, c: Comparison, precision: int) -> None:
    doc.add(Heading("The query's vector in A and in B"))
    doc.add(Paragraph(
        "The cosine of the query's vector in A and its vector in B after the embeddings and after each layer: "
        "1 means the same direction; the lower it is, the more the context has moved the two apart."
    ))
    names = ["embeddings", *(f"layer {layer}" for layer in range(c.n_layers))]
    doc.add(Table(["after", "cosine"], [[name, fmt(v, precision)] for name, v in zip(names, c.token_cosine)]))
    if c.similarity is None:  # a causal decoder: the notes above say why there is none
        return
    doc.add(Paragraph(
        "The two sentences as wholes: the cosine of their sentence embeddings (the mean of the last layer's "
        "token vectors, scaled to length 1), as selfattn similarity prints it:"
    ))
    doc.add(Paragraph(f"Sentence similarity: {fmt(c.similarity, precision)}"))


def summary(c: Comparison, precision: int) -> list[Paragraph | Lines]:
    differ = [h for h in c.heads if h.top_a[0].token != h.top_b[0].token]
    said = [Paragraph(f"The top token differs between A and B in {len(differ)} of {len(c.heads)} heads.")]
    if c.model is not None:
        lowest = min(range(c.n_layers + 1), key=lambda after: c.token_cosine[after])
        name = "the embeddings" if lowest == 0 else f"layer {lowest - 1}"
        said.append(Paragraph(
            f"The query's two vectors are furthest apart after {name} (cosine {fmt(c.token_cosine[lowest], precision + 1)})."
        ))
    widest = max(c.heads, key=lambda h: abs(h.entropy_a - h.entropy_b))
    said.append(Paragraph(
        f"The entropy changes most in layer {widest.layer} head {widest.head}: {fmt(widest.entropy_a, precision)} "
        f"bits in A, {fmt(widest.entropy_b, precision)} bits in B."
    ))
    if c.model is not None:
        said.append(Paragraph("To walk through that head in each sentence:"))
        for label, sentence, index in zip("AB", c.sentences, (c.index_a, c.index_b)):
            text = shlex.quote(sentence) if len(sentence) <= 60 else f"SENTENCE_{label}"
            model = shlex.quote(c.model_arg or c.model)
            said.append(Lines([
                f"selfattn explain {text} --model {model} --layer {widest.layer} --head {widest.head} --query {index}"
            ]))
    return said


def top_cell(entries: tuple[AttendedToken, ...], precision: int) -> str:
    """'[CLS] #0 0.41, bank #6 0.20, river #5 0.12'; a model's tokens as they read ('␣cat')."""
    return ", ".join(
        f"{display_token(token_label(e.token, e.readable))} #{e.index} {fmt(e.weight, precision)}" for e in entries
    )


def shown_token(c: Comparison, tokens: list[str], index: int, readable: list[str] | None) -> str:
    """One token of a sentence as the tables show it."""
    return display_token(token_label(tokens[index], None if readable is None else readable[index]))


def describe(c: Comparison) -> str:
    if c.model is not None:
        a = c.attention
        heads = f"{c.n_heads} heads"
        if a is not None and a.n_kv_heads != a.n_heads:
            shared = f"{a.n_kv_heads} key/value head{'s' if a.n_kv_heads > 1 else ''}"
            grouping = "multi-query" if a.n_kv_heads == 1 else "grouped-query"
            heads = f"{c.n_heads} query heads sharing {shared} ({grouping} attention)"
        kind = ""
        if a is not None:
            kind = ("a causal decoder (each token sees itself and the tokens before it)" if a.causal
                    else "an encoder (every token sees every token)") + ", "
        positions = "" if a is None else f"; positions: {'RoPE' if a.positional == 'rope' else 'a learned table'}"
        return f"{c.model}, {kind}{c.n_layers} layers of {heads}, on its own tokens and embeddings{positions}"
    heads = f"{c.n_heads} head{'s' if c.n_heads != 1 else ''}"
    return f"the {c.variant} variant, one layer of {heads}; embeddings: {c.source}"


def quoted(c: Comparison) -> str:
    a = token_label(c.token_a, None if c.readable_a is None else c.readable_a[c.index_a])
    b = token_label(c.token_b, None if c.readable_b is None else c.readable_b[c.index_b])
    return repr(a) if a == b else f"{a!r} and {b!r}"
