"""``selfattn similarity``: sentence vectors from an encoder, and the cosine of every pair.

The model embeds each sentence (mean-pooled, unit length); ``analysis.similarity`` finds
the cosines and the closest and farthest pair; ``explain.similarity`` writes them.
"""

from __future__ import annotations

from typing import TextIO

import torch

from selfattn.analysis.sentence_similarity import cosine_similarities, extreme_pairs
from selfattn.errors import ModelError, SentenceError
from selfattn.commands.model_options import check_similarity_options
from selfattn.render.text.command_output import label, write_document, write_json
from selfattn.render.text.similarity_report import similarity_document, similarity_to_dict
from selfattn.models.loading import shared_model



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
    check_similarity_options(sentences, model_name, output_format, precision)
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
