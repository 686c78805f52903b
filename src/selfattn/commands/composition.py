"""``selfattn heads --composition``: which heads can read which, from the weights alone (``analysis.composition``)."""

from __future__ import annotations

from typing import TextIO

from selfattn.analysis.head_composition import composition_scores
from selfattn.render.text.command_output import write_document, write_json
from selfattn.render.text.composition_report import composition_document, composition_to_dict
from selfattn.models.loading import shared_model


def composition_command(model_name: str, output_format: str, precision: int, stream: TextIO) -> None:
    """Print every pair of heads' Q-, K- and V-composition scores: the strongest pairs, or all of them as JSON.

    The options have been checked where they entered (``check_composition_options``).

    Raises:
        ModelError: the model has fewer than two layers, or layers with different numbers of heads.
    """
    model = shared_model(model_name)
    data = composition_to_dict(model.name, composition_scores(model))
    if output_format == "json":
        write_json(data, stream)
        return
    write_document(composition_document(data, precision), f"Which heads read which in {model.name}", output_format,
                   stream)
