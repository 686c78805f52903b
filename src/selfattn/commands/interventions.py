"""``selfattn ablate`` and ``selfattn patch``: change a decoder's heads and show what follows.

ablate: the loss over a text (or the induction probe's second copy) and the next tokens,
with every head and with the named heads knocked out (``analysis.interventions.ablate``).
patch: activation patching, the fraction of the clean answer each head brings back to the
corrupted input (``patching``), as a table, JSON and a heatmap.
"""

from __future__ import annotations

from typing import TextIO

from selfattn.analysis.ablation import ablation_report
from selfattn.analysis.head_interventions import patching
from selfattn.analysis.next_token import probe_positions, text_positions
from selfattn.analysis.inputs import PROBE_LENGTH, PROBE_SEED
from selfattn.analysis.probes import induction_probe_for
from selfattn.errors import OptionError
from selfattn.render.text.command_output import write_document, write_json
from selfattn.render.text.intervention_report import (
    ablation_document, ablation_to_dict, attribution_document, attribution_to_dict, path_patching_document,
    path_patching_to_dict, patching_document, patching_to_dict,
)
from selfattn.models.loading import shared_model
from selfattn.models.registry import decoder_names

def decoder_model(model_name: str, command: str):
    """The model, if it is a decoder.

    Raises:
        OptionError: it is an encoder (no next-token loss).
    """
    model = shared_model(model_name)
    if not model.attention_info(0).causal:
        raise OptionError(
            f"{command} reads what a model predicts for the next token, which only a decoder does ({', '.join(decoder_names())}): "
            f"{model.name} is an encoder")
    return model


def ablate_command(
    text: str | None, model_name: str, pairs: list[tuple[int, int]], mode: str, output_format: str, precision: int,
    stream: TextIO, probe: str | None = None, probe_length: int | None = None, seed: int | None = None,
    sampling: tuple | None = None,
) -> None:
    """Knock heads out of a decoder and print the loss and the next tokens before and after.

    Every option has been checked where it entered (``check_ablate_options``, before torch
    loads); what needs the model (the heads' range) is checked here, once.

    Args:
        text: the text to score; None with a probe.
        model_name: a decoder's name or folder.
        pairs: the (layer, head) pairs to knock out, parsed from --heads.
        mode: "zero" or "mean".
        output_format: "text", "markdown" or "json".
        precision: decimals in text and markdown.
        stream: where to write.
        probe: None or "induction": score the probe's second copy instead of a text.
        probe_length: tokens in one copy (default PROBE_LENGTH); needs the probe.
        seed: the probe's seed (default PROBE_SEED); needs the probe.
        sampling: None, or (new tokens, temperature, top_k, top_p, seed), checked: the input is
            also continued with every head and with the heads knocked out.

    Raises:
        OptionError: malformed --heads, a head or layer out of range, an unknown mode, a
            text and a probe together or neither, an encoder.
        SentenceError: the text is not usable, or has fewer than two tokens.
    """
    model = decoder_model(model_name, "ablate")
    if probe is not None:
        made = induction_probe_for(model, PROBE_LENGTH if probe_length is None else probe_length,
                                   PROBE_SEED if seed is None else seed)
        encoded, positions = model.tokenize(made.ids), probe_positions(made.length, made.offset)
    else:
        made, encoded = None, model.tokenize(text)
        positions = text_positions(encoded.input_ids.shape[1])
    report = ablation_report(model, encoded, pairs, mode, positions, made)
    data = ablation_to_dict(model.name, text, made, report)
    if sampling is not None:
        data["generated"] = written_with_and_without(model, encoded.input_ids[0].tolist(), pairs, mode, sampling)
    if output_format == "json":
        write_json(data, stream)
        return
    write_document(ablation_document(data, report, precision), f"Knocking heads out of {model.name}", output_format, stream)


def patch_command(
    clean: str, corrupted: str, model_name: str, target: str, output_format: str, precision: int, stream: TextIO,
    target_path=None, output_file: str | None = None, path: dict | None = None,
) -> None:
    """Activation patching of every head (or path patching): print the fraction recovered, draw it to ``target_path``.

    The options have been checked where they entered (``check_patch_options``, which
    gives ``target_path`` from ``output_file`` and ``path``: senders, receivers, via,
    positions).

    Raises:
        OptionError: an encoder, a target that is not one token, inputs that give the
            target the same log-probability, a head out of range, a sender not before every
            receiver, a position outside the texts.
        SentenceError: an input is not usable, or the two differ in token length.
    """
    path = path or {}
    model = decoder_model(model_name, "patch")
    run = patching(model, clean, corrupted, target, path.get("senders"), path.get("receivers"), path.get("via"),
                   path.get("positions"))
    if path.get("senders") is not None:
        data = path_patching_to_dict(model, clean, corrupted, run)
        if output_format == "json":
            write_json(data, stream)
            return
        write_document(path_patching_document(data, precision), f"Patching a path in {model.name}", output_format,
                       stream)
        return
    data = patching_to_dict(model, clean, corrupted, run)
    if target_path is not None:
        from selfattn.render.visual.patch_plot import patching_figure
        from selfattn.render.visual.plots import save_figure

        save_figure(patching_figure(data), target_path)
    if output_format == "json":
        write_json(data, stream)
        return
    write_document(patching_document(data, precision, output_file), f"Patching heads of {model.name}", output_format, stream)


def attribute_command(
    text: str, model_name: str, target: str, position: int | None, output_format: str, precision: int, stream: TextIO,
    picture=None, output_file: str | None = None,
) -> None:
    """Direct logit attribution: print each head's share of the target's logit, and draw it to ``picture``.

    The options have been checked where they entered (``check_attribute_options``, which
    gives ``picture`` from ``output_file``).

    Raises:
        OptionError: an encoder, a target that is not one token, a position outside the
            text, or an output file that cannot be written.
        SentenceError: the text is not usable.
    """
    from selfattn.analysis.attribution import attribute

    model = decoder_model(model_name, "attribute")
    found = attribute(model, text, target, position)
    data = attribution_to_dict(model, text, found)
    if picture is not None:
        from selfattn.render.visual.patch_plot import attribution_figure
        from selfattn.render.visual.plots import save_figure

        save_figure(attribution_figure(data), picture)
    if output_format == "json":
        write_json(data, stream)
        return
    write_document(attribution_document(data, precision, output_file), f"Who writes the logit in {model.name}",
                   output_format, stream)


def written_with_and_without(model, ids: list[int], pairs, mode: str, sampling: tuple) -> dict:
    """The continuation of ``ids`` with every head and with ``pairs`` knocked out: {"before", "after"} texts and ids,
    and the sampling used."""
    from selfattn.analysis.head_interventions import knocked_out

    count, temperature, top_k, top_p, seed = sampling
    before = model.generate(ids, count, temperature, top_k, top_p, seed)
    with knocked_out(model, pairs, mode):
        after = model.generate(ids, count, temperature, top_k, top_p, seed)
    return {"new_tokens": count, "temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed,
            "before": before.text[0], "after": after.text[0], "ids_before": before.ids[0], "ids_after": after.ids[0]}
