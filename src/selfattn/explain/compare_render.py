"""`selfattn compare`: a Comparison as text, markdown or JSON.

The numbers come from ``selfattn.comparison.compare``; this module only lays them out:
one table with a row per layer and head (the query's top three keys and the entropy of
its row in each sentence), and for a model the query's cosine after each layer and the
two sentences' similarity. JSON keeps every number at full precision.
"""

from __future__ import annotations

import shlex
from typing import Any, TextIO

from selfattn.comparison import AttendedToken, Comparison, HeadComparison
from selfattn.explain.command_output import check_output, shorten, write_document, write_json
from selfattn.explain.document import (
    Document,
    Heading,
    Lines,
    Note,
    Paragraph,
    Table,
    display_token,
    fmt,
)


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
        data["token_cosine"] = list(c.token_cosine)
        data["similarity"] = c.similarity
    if c.notes:
        data["notes"] = list(c.notes)
    return data


def head_to_dict(h: HeadComparison) -> dict[str, Any]:
    def top(entries: tuple[AttendedToken, ...]) -> list[dict[str, Any]]:
        return [{"token": e.token, "index": e.index, "weight": e.weight} for e in entries]

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
    unit = "WordPiece tokens" if c.model else "tokens"
    rows = [[label, display_token(shorten(sentence)), str(len(tokens)), f"{display_token(tokens[index])} #{index}"]
            for label, sentence, tokens, index in (("A", c.sentences[0], c.tokens_a, c.index_a),
                                                   ("B", c.sentences[1], c.tokens_b, c.index_b))]
    doc.add(Table(["", "sentence", unit, "query"], rows, numeric_from=2))
    doc.add(Paragraph(f"Attention: {describe(c)}."))
    doc.add(Paragraph(
        "How to read it: each row is one head. For the query it lists the three tokens it puts the most "
        "weight on in each sentence, as token #index weight, and the entropy H of its row of weights in "
        "bits (0: all the weight on one token; log2 n: spread evenly over n tokens). Indices, layers and "
        "heads count from 0" + (" ([CLS] is token 0)." if c.model else ".")
    ))
    rows = [
        [str(h.layer), str(h.head), top_cell(h.top_a, precision), top_cell(h.top_b, precision),
         fmt(h.entropy_a, precision), fmt(h.entropy_b, precision)]
        for h in c.heads
    ]
    doc.add(Table(["layer", "head", "top 3 in A", "top 3 in B", "H_A", "H_B"], rows, numeric_from=4))
    for note in c.notes:
        doc.add(Note(note, True))
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
            said.append(Lines([
                f"selfattn explain {text} --model {c.model} --layer {widest.layer} --head {widest.head} --query {index}"
            ]))
    return said


def top_cell(entries: tuple[AttendedToken, ...], precision: int) -> str:
    """'[CLS] #0 0.41, bank #6 0.20, river #5 0.12'"""
    return ", ".join(f"{display_token(e.token)} #{e.index} {fmt(e.weight, precision)}" for e in entries)


def describe(c: Comparison) -> str:
    if c.model is not None:
        return f"{c.model}, {c.n_layers} layers of {c.n_heads} heads, on its own tokens and embeddings"
    heads = f"{c.n_heads} head{'s' if c.n_heads != 1 else ''}"
    return f"the {c.variant} variant, one layer of {heads}; embeddings: {c.source}"


def quoted(c: Comparison) -> str:
    return repr(c.token_a) if c.token_a == c.token_b else f"{c.token_a!r} and {c.token_b!r}"
