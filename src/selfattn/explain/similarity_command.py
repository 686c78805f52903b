"""`selfattn similarity`: how alike a pretrained model finds the user's sentences.

Each sentence is embedded (``BertModel.encode``: mean-pooled, L2-normalised) and the
cosine similarity of every pair is printed as text, markdown or JSON, with the most and
least similar pairs. Sentences are labelled A, B, ... as spreadsheet columns.
"""

from __future__ import annotations

from typing import TextIO

import torch

from selfattn.errors import ModelError, OptionError, SentenceError
from selfattn.explain.command_output import check_output, check_sentence, shorten, write_document, write_json
from selfattn.explain.document import Document, Lines, Note, Paragraph, Table, display_token, fmt
from selfattn.explain.text import PIPED_WIDTH
from selfattn.models.loading import shared_model

MAX_SIMILARITY_SENTENCES = 64


def similarity_command(
    sentences: list[str], model_name: str, output_format: str, precision: int, stream: TextIO
) -> None:
    """Embed each sentence with ``model_name`` and print the cosine similarity of every pair.

    Args:
        sentences: 2 to ``MAX_SIMILARITY_SENTENCES`` non-empty strings.
        model_name: a pretrained model's name, e.g. "all-MiniLM-L6-v2".
        output_format: "text", "markdown" or "json".
        precision: decimals for the scores in text and markdown.
        stream: where to write.

    Raises:
        OptionError: an unknown format or precision, or too few or too many sentences.
        SentenceError: a sentence is not a non-empty string, or too long for the model.
    """
    check_output(output_format, precision)
    check_sentences(sentences)
    model = shared_model(model_name)
    if not hasattr(model, "encode"):
        raise ModelError(
            f"{model.name} is a decoder: similarity needs a sentence encoder such as all-MiniLM-L6-v2 "
            f"(or a BERT folder), trained so that similar sentences get close mean-pooled vectors"
        )
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
    """S = E E^T for rows of unit length: S_ij = cos(e_i, e_j).   (s, d) -> (s, s) float64

    Args:
        embeddings: (s, d), one unit-length row per sentence.

    Returns:
        (s, s) float64, the cosine of every pair.
    """
    e = embeddings.to(torch.float64)  # float64 so the diagonal is 1 to ~1e-7 and S stays symmetric
    return e @ e.T  # (s, d) @ (d, s) -> (s, s)


def extreme_pairs(similarity: torch.Tensor) -> tuple[tuple[int, int], tuple[int, int]]:
    """The most and least similar pairs i < j (first pair wins ties).   (s, s) with s >= 2

    Args:
        similarity: (s, s), the cosine of every pair.

    Returns:
        (i, j) of the most similar pair, then (i, j) of the least similar.
    """
    s = similarity.shape[0]
    pairs = [(i, j) for i in range(s) for j in range(i + 1, s)]
    most = max(pairs, key=lambda p: float(similarity[p]))
    least = min(pairs, key=lambda p: float(similarity[p]))
    return most, least


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


def check_sentences(sentences) -> None:
    """Refuse anything but a list of 2 to ``MAX_SIMILARITY_SENTENCES`` non-empty strings.

    Args:
        sentences: what the user gave as the sentences.

    Raises:
        OptionError: not a list or tuple, or too few or too many sentences.
        SentenceError: a sentence is not a non-empty string.
    """
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
    """0 -> A, 25 -> Z, 26 -> AA, as spreadsheet columns.

    Args:
        index: a sentence's 0-based position.

    Returns:
        Its label.
    """
    text = ""
    index += 1
    while index:
        index, rest = divmod(index - 1, 26)
        text = chr(ord("A") + rest) + text
    return text
