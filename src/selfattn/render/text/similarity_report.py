"""`selfattn similarity`: how alike a pretrained model finds the user's sentences.

Each sentence is embedded (``BertModel.encode``: mean-pooled, L2-normalised) and the
cosine similarity of every pair is printed as text, markdown or JSON, with the most and
least similar pairs. Sentences are labelled A, B, ... as spreadsheet columns.
"""

from __future__ import annotations


import torch

from selfattn.render.text.command_output import label, shorten
from selfattn.render.text.document import Document, Lines, Note, Paragraph, Table, display_token, fmt
from selfattn.render.text.text import PIPED_WIDTH

def similarity_to_dict(model_name, sentences, similarity, most, least) -> dict:
    """The scores as plain data, for --format json.

    Args:
        model_name: the model's name.
        sentences: the sentences, in the order given.
        similarity: (s, s), the cosine of every pair.
        most: (i, j) of the most similar pair.
        least: (i, j) of the least similar pair.

    Returns:
        A dict with the model, sentences, their labels, the full matrix and the two pairs
        with their scores.
    """
    def pair(p) -> dict:
        return {"pair": list(p), "score": float(similarity[p])}

    return {"model": model_name, "sentences": list(sentences), "labels": [label(i) for i in range(len(sentences))],
            "similarity": similarity.tolist(), "most_similar": pair(most), "least_similar": pair(least)}


def similarity_document(sentences, lengths, width, similarity, most, least, precision) -> Document:
    """The sentences, their similarity matrix (or each one's neighbours) and a summary, as a Document.

    Args:
        sentences: the sentences, in the order given.
        lengths: each sentence's number of tokens.
        width: d, the length of each embedding.
        similarity: (s, s), the cosine of every pair.
        most: (i, j) of the most similar pair.
        least: (i, j) of the least similar pair.
        precision: decimals for the scores.

    Returns:
        The Document to render as text or markdown.
    """
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
    """One row per sentence: the other sentence it is most and least similar to, with the scores.

    Args:
        labels: each sentence's label.
        similarity: (s, s), the cosine of every pair.
        precision: decimals for the scores.

    Returns:
        One row per sentence: its label, the closest label and cosine, the farthest label and cosine.
    """
    rows = []
    for i, scores in enumerate(similarity.tolist()):
        others = [j for j in range(len(labels)) if j != i]
        near, far = max(others, key=lambda j: scores[j]), min(others, key=lambda j: scores[j])
        rows.append([labels[i], labels[near], fmt(scores[near], precision), labels[far], fmt(scores[far], precision)])
    return rows


def table_width(columns: list[str], rows: list[list[str]]) -> int:
    """Characters a table takes as text: each column's widest cell plus 3 of padding and rule.

    Args:
        columns: the header cells.
        rows: the body's cells, as strings.

    Returns:
        The table's width in characters.
    """
    return sum(max(len(row[c]) for row in [columns, *rows]) + 3 for c in range(len(columns))) + 1
