"""`selfattn heads` and `selfattn similarity`: a pretrained model on the user's sentences.

heads: run the model once, classify every layer's every head (``head_roles``) and print a
table with a short explanation. similarity: embed each sentence (``BertModel.encode``:
mean-pooled, L2-normalised) and print the cosine similarity of every pair. Both write
text, markdown or JSON through the project's document model and renderers.
"""

from __future__ import annotations

import json
import math
import shlex
from collections import Counter
from typing import TextIO

import torch

from selfattn.config import check_precision
from selfattn.errors import OptionError, SentenceError
from selfattn.explain.document import Document, Heading, Lines, Note, Paragraph, Table, display_token, fmt
from selfattn.explain.json_out import _compact, plain
from selfattn.explain.text import PIPED_WIDTH
from selfattn.models.head_roles import PATTERNS, ROLE_THRESHOLD, ROLES, HeadRole, classify_heads
from selfattn.models.loading import shared_model
from selfattn.pipeline.embeddings import SEED_SENTENCE

FORMATS = ("text", "json", "markdown")
MAX_SIMILARITY_SENTENCES = 64
SHOWN_TOKENS = 48  # a longer token list is shortened in the text
SHOWN_CHARS = 70  # a longer sentence is cut in the sentence table
TOP_HEADS = 3  # how many most focused / most spread heads the summary names
PATTERN_COLUMNS = {"previous token": "prev", "next token": "next", "self": "self", "[CLS]/[SEP]": "[CLS]/[SEP]"}


# ---------------------------------------------------------------- heads


def heads_command(sentence: str | None, model_name: str, output_format: str, precision: int, stream: TextIO) -> None:
    """Classify every head of ``model_name`` on one sentence (None: the seed's) and print the table."""
    check_output(output_format, precision)
    text = SEED_SENTENCE if sentence is None else sentence
    check_sentence(text)
    model = shared_model(model_name)
    with torch.no_grad():
        out = model(text, output_attentions=True)  # one text: no padding; > 512 tokens is refused here
    tokens = out.tokens[0]
    attentions = torch.stack([layer[0] for layer in out.attentions])  # (layers, heads, n, n)
    roles = classify_heads(attentions, tokens)
    if output_format == "json":
        write_json(heads_to_dict(model.name, text, tokens, roles), stream)
        return
    doc = heads_document(model.name, text, tokens, roles, precision, sentence is None)
    write_document(doc, f"Attention heads of {model.name}", output_format, stream)


def heads_to_dict(model_name: str, sentence: str, tokens: list[str], roles: list[list[HeadRole]]) -> dict:
    heads = [
        {"layer": layer, "head": head, "role": r.role, "share": r.share, "entropy": r.entropy,
         "normalized_entropy": r.normalized_entropy, "shares": dict(r.shares)}
        for layer, row in enumerate(roles) for head, r in enumerate(row)
    ]
    counts = Counter(h["role"] for h in heads)
    return {"model": model_name, "sentence": sentence, "tokens": tokens, "threshold": ROLE_THRESHOLD,
            "heads": heads, "roles": {role: counts[role] for role in ROLES}}


def heads_document(
    model_name: str, sentence: str, tokens: list[str], roles: list[list[HeadRole]], precision: int, is_seed: bool
) -> Document:
    n = len(tokens)
    shown = tokens if n <= SHOWN_TOKENS else tokens[: SHOWN_TOKENS - 4] + ["…"] + tokens[-3:]
    heads = [(layer, head, r) for layer, row in enumerate(roles) for head, r in enumerate(row)]
    doc = Document()
    doc.add(
        Paragraph(f"Sentence: {display_token(sentence)}"),
        Paragraph(f"{n} WordPiece tokens: {' '.join(display_token(t) for t in shown)}"),
        Heading("How to read the table"),
        Paragraph(
            "Each head gives every token a row of weights over all the tokens. We read the rows of the "
            "words (not [CLS] and [SEP]) and measure four patterns, in percent of a row's weight averaged "
            "over the words: weight on the word just before (prev), on the word just after (next), on the "
            "word itself (self), and on [CLS] and [SEP] together. The first word has no word before it, so "
            "prev leaves it out (its weight on [CLS] counts under [CLS]/[SEP]); the last word, likewise, for "
            f"next. A head's role is its largest pattern when that pattern holds at least {ROLE_THRESHOLD:.0%} "
            "of the weight; otherwise the weight is shared out and the role is spread."
        ),
        Paragraph("Entropy (H) says how spread a row is, in bits, averaged over the words:"),
        Lines([
            f"{'H = -sum_j a_j log2 a_j':33}(0 log2 0 counts as 0)",
            f"{'H = 0 bits':33}one token takes all the weight",
            f"{f'H = log2 n = {fmt(math.log2(n), 2)} bits':33}each of the n = {n} tokens gets the same weight",
        ]),
        Paragraph(
            "H / log2 n puts this on a scale from 0 (focused) to 1 (uniform). Layers and heads count from 0, "
            "as --layer and --head of selfattn explain --model."
        ),
    )
    if n <= 2:
        doc.add(Note("the text has no word tokens, only [CLS] and [SEP]: the heads can only look at those", True))
    columns = ["layer", "head", "role", *PATTERN_COLUMNS.values(), "H (bits)", "H / log2 n"]
    rows = [
        [str(layer), str(head), r.role, *(percent(r.shares[p], precision) for p in PATTERNS),
         fmt(r.entropy, precision), fmt(r.normalized_entropy, precision)]
        for layer, head, r in heads
    ]
    doc.add(Table(columns, rows, numeric_from=3))
    doc.add(Heading("Summary"), *heads_summary(model_name, sentence, heads, precision, is_seed))
    doc.add(Note(
        "many heads of BERT-like encoders put their weight on [CLS] and [SEP] when they find nothing to do "
        "in a sentence, so a [CLS]/[SEP] role often means the head is idle on this input."
    ))
    return doc


def heads_summary(model_name, sentence, heads, precision, is_seed) -> list[Paragraph | Lines]:
    counts = Counter(r.role for _, _, r in heads)
    by_entropy = sorted(heads, key=lambda item: (item[2].normalized_entropy, item[0], item[1]))

    def named(items) -> str:
        return "; ".join(
            f"layer {layer} head {head} ({fmt(r.entropy, precision)} bits, {r.role}"
            + (f" {percent(r.share, precision)})" if r.role != "spread" else ")")
            for layer, head, r in items
        )

    layer, head, _ = by_entropy[0]
    quoted = "" if is_seed else " " + shlex.quote(sentence if len(sentence) <= 90 else "YOUR SENTENCE")
    return [
        Paragraph("Roles: " + ", ".join(f"{counts[role]} {role}" for role in ROLES) + f" (of {len(heads)} heads)."),
        Paragraph(f"Most focused: {named(by_entropy[:TOP_HEADS])}."),
        Paragraph(f"Most spread out: {named(by_entropy[::-1][:TOP_HEADS])}."),
        Paragraph("To walk through the most focused head step by step:"),
        Lines(command_lines(f"selfattn explain{quoted}", f"--model {model_name} --layer {layer} --head {head}")),
    ]


def command_lines(start: str, rest: str) -> list[str]:
    """A shell command on one line, or on two joined by a backslash when one would pass 96 characters."""
    return [f"{start} {rest}"] if len(start) + len(rest) < 96 else [f"{start} \\", f"    {rest}"]


# ---------------------------------------------------------------- similarity


def similarity_command(
    sentences: list[str], model_name: str, output_format: str, precision: int, stream: TextIO
) -> None:
    """Embed each sentence with ``model_name`` and print the cosine similarity of every pair."""
    check_output(output_format, precision)
    check_sentences(sentences)
    model = shared_model(model_name)
    lengths = []
    for index, sentence in enumerate(sentences):
        try:
            lengths.append(len(model.tokenize(sentence).tokens[0]))
        except SentenceError as error:  # too long: say which sentence, by its label
            raise SentenceError(f"sentence {label(index)}: {error}") from None
    with torch.no_grad():
        embeddings = model.encode(list(sentences))  # (s, d), each row of length 1
    similarity = cosine_similarities(embeddings)  # (s, s)
    most, least = extreme_pairs(similarity)
    if output_format == "json":
        write_json(similarity_to_dict(model.name, sentences, similarity, most, least), stream)
        return
    doc = similarity_document(sentences, lengths, int(embeddings.shape[1]), similarity, most, least, precision)
    write_document(doc, f"Sentence similarity with {model.name}", output_format, stream)


def cosine_similarities(embeddings: torch.Tensor) -> torch.Tensor:
    """S = E E^T for rows of unit length: S_ij = cos(e_i, e_j).   (s, d) -> (s, s) float64"""
    e = embeddings.to(torch.float64)  # float64 so the diagonal is 1 to ~1e-7 and S stays symmetric
    return e @ e.T  # (s, d) @ (d, s) -> (s, s)


def extreme_pairs(similarity: torch.Tensor) -> tuple[tuple[int, int], tuple[int, int]]:
    """The most and least similar pairs i < j (first pair wins ties).   (s, s) with s >= 2"""
    s = similarity.shape[0]
    pairs = [(i, j) for i in range(s) for j in range(i + 1, s)]
    most = max(pairs, key=lambda p: float(similarity[p]))
    least = min(pairs, key=lambda p: float(similarity[p]))
    return most, least


def similarity_to_dict(model_name, sentences, similarity, most, least) -> dict:
    def pair(p) -> dict:
        return {"pair": list(p), "score": float(similarity[p])}

    return {"model": model_name, "sentences": list(sentences), "labels": [label(i) for i in range(len(sentences))],
            "similarity": similarity.tolist(), "most_similar": pair(most), "least_similar": pair(least)}


def similarity_document(sentences, lengths, width, similarity, most, least, precision) -> Document:
    labels = [label(i) for i in range(len(sentences))]
    doc = Document()
    doc.add(Paragraph(
        f"Each sentence becomes one vector of {width} numbers: the mean of the model's last-layer token "
        "vectors, scaled to length 1. For vectors of length 1 the cosine similarity is just the dot "
        "product: 1 means the same direction (same meaning, as far as the model can tell), 0 means "
        "unrelated, and negative means opposite."
    ))
    doc.add(Lines(["S_ij = e_i . e_j = cos(e_i, e_j)       all pairs at once: S = E E^T"]))
    rows = [[lab, display_token(shorten(s)), str(n)] for lab, s, n in zip(labels, sentences, lengths)]
    doc.add(Table(["", "sentence", "tokens"], rows, title="Sentences", numeric_from=2))
    matrix = [[lab, *(fmt(v, precision) for v in row)] for lab, row in zip(labels, similarity.tolist())]
    if table_width(["", *labels], matrix) <= PIPED_WIDTH:
        doc.add(Table(["", *labels], matrix, title="Cosine similarity"))
    else:  # too many columns to read: each sentence's nearest and farthest neighbour instead
        doc.add(Table(["", "closest", "cosine", "farthest", "cosine"], neighbours(labels, similarity, precision),
                      title="Cosine similarity: each sentence's closest and farthest other sentence", numeric_from=5))
        doc.add(Note("the full matrix is too wide to read here; --format json has every pair."))

    def said(p) -> str:
        i, j = p
        return f"{labels[i]} and {labels[j]} ({fmt(similarity[p], precision)})"

    if len(sentences) == 2:
        doc.add(Paragraph(f"The two sentences score {fmt(similarity[most], precision)}."))
    else:
        doc.add(Paragraph(f"Most similar: {said(most)}. Least similar: {said(least)}."))
    return doc


def neighbours(labels: list[str], similarity: torch.Tensor, precision: int) -> list[list[str]]:
    """One row per sentence: the other sentence it is most and least similar to, with the scores."""
    rows = []
    for i, scores in enumerate(similarity.tolist()):
        others = [j for j in range(len(labels)) if j != i]
        near, far = max(others, key=lambda j: scores[j]), min(others, key=lambda j: scores[j])
        rows.append([labels[i], labels[near], fmt(scores[near], precision), labels[far], fmt(scores[far], precision)])
    return rows


def table_width(columns: list[str], rows: list[list[str]]) -> int:
    """Characters a table takes as text: each column's widest cell plus 3 of padding and rule."""
    return sum(max(len(row[c]) for row in [columns, *rows]) + 3 for c in range(len(columns))) + 1


# ---------------------------------------------------------------- shared


def check_output(output_format: str, precision: int) -> None:
    if output_format not in FORMATS:
        raise OptionError(f"unknown format {output_format!r}: choose one of {', '.join(FORMATS)}")
    check_precision(precision)


def check_sentence(sentence, name: str = "the sentence") -> None:
    if not isinstance(sentence, str):
        raise SentenceError(f"{name} must be a string, got {type(sentence).__name__}")
    if not sentence.strip():
        raise SentenceError(f"{name} is empty: give at least one word")


def check_sentences(sentences) -> None:
    if isinstance(sentences, str) or not isinstance(sentences, (list, tuple)):
        raise OptionError("give the sentences as a list of strings")
    if not 2 <= len(sentences) <= MAX_SIMILARITY_SENTENCES:
        raise OptionError(
            f"similarity compares 2 to {MAX_SIMILARITY_SENTENCES} sentences, got {len(sentences)}: "
            'quote each one, e.g. selfattn similarity "A cat sat" "A dog ran"'
        )
    for index, sentence in enumerate(sentences):
        check_sentence(sentence, f"sentence {label(index)}")


def label(index: int) -> str:
    """0 -> A, 25 -> Z, 26 -> AA, as spreadsheet columns."""
    text = ""
    index += 1
    while index:
        index, rest = divmod(index - 1, 26)
        text = chr(ord("A") + rest) + text
    return text


def shorten(sentence: str) -> str:
    return sentence if len(sentence) <= SHOWN_CHARS else sentence[: SHOWN_CHARS - 1] + "…"


def percent(share: float, precision: int) -> str:
    """A share in percent, as fine as the share itself at ``precision`` decimals (0.1234 at 4 -> 12.34%)."""
    return fmt(100 * share, max(precision - 2, 0)) + "%"


def write_json(data: dict, stream: TextIO) -> None:
    """Full-precision JSON: nested objects indented, each record of a list (one head) on one line."""
    stream.write(_layout(plain(data), 0) + "\n")


def _layout(value, indent: int) -> str:
    pad = "  " * indent
    if isinstance(value, dict) and value:
        items = [f"{pad}  {json.dumps(k)}: {_layout(v, indent + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        rows = [f"{pad}  {json.dumps(v, ensure_ascii=False, allow_nan=False)}" for v in value]
        return "[\n" + ",\n".join(rows) + "\n" + pad + "]"
    return _compact(value, indent)  # numbers, strings, lists: one line per row of a matrix


def write_document(doc: Document, title: str, output_format: str, stream: TextIO) -> None:
    if output_format == "markdown":
        from selfattn.explain.markdown import render_markdown

        stream.write(render_markdown(doc, title))
    else:
        from selfattn.explain.text import render_text

        render_text(Document([Heading(title), *doc.blocks]), stream)
