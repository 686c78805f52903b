"""``selfattn heads``: what every head of a pretrained model does on a sentence, or on a probe.

Run the model once and score every layer's every head: an encoder's heads get
``head_roles``'s roles (previous, next, self, [CLS]/[SEP]); a decoder's (causal) heads get
``decoder_roles``'s pattern scores (previous token, duplicate token, induction, first
token), on the sentence or on the induction probe (``--probe induction``). The tables and
JSON are written by ``explain.encoder_heads`` and ``explain.decoder_heads``.
"""

from __future__ import annotations

from typing import TextIO

import torch

from selfattn.analysis.decoder_roles import classify_decoder_heads, induction_probe_score
from selfattn.analysis.head_roles import classify_heads
from selfattn.analysis.probes import PROBE_LENGTH, PROBE_SEED, Probe, check_probe_options, induction_probe_for
from selfattn.errors import OptionError
from selfattn.explain.command_output import check_output, check_sentence, write_document, write_json
from selfattn.explain.decoder_heads import decoder_heads_document, decoder_heads_to_dict
from selfattn.explain.encoder_heads import heads_document, heads_to_dict
from selfattn.models.loading import shared_model
from selfattn.models.registry import decoder_names
from selfattn.pipeline.embeddings import SEED_SENTENCE


def heads_command(
    sentence: str | None, model_name: str, output_format: str, precision: int, stream: TextIO,
    probe: str | None = None, probe_length: int | None = None, seed: int | None = None,
) -> None:
    """Classify every head of ``model_name`` on one sentence, or on a probe, and print the table.

    Args:
        sentence: the text to run the model on; None for the seed's sentence (or the probe).
        model_name: a pretrained model's name, e.g. "all-MiniLM-L6-v2", or a model folder.
        output_format: "text", "markdown" or "json".
        precision: decimals for the numbers in text and markdown.
        stream: where to write.
        probe: None, or "induction": a decoder reads random tokens repeated twice instead of a sentence.
        probe_length: the random tokens in one copy of the probe (default PROBE_LENGTH); needs ``probe``.
        seed: the seed of the probe's tokens (default PROBE_SEED); needs ``probe``.

    Raises:
        OptionError: an unknown format, precision or probe; a probe with a sentence, on an
            encoder, or longer than the model's positions; probe_length or seed without a probe.
        SentenceError: the sentence is not a non-empty string, or too long for the model.
    """
    check_output(output_format, precision)
    check_probe_options(sentence, probe, probe_length, seed)
    text = SEED_SENTENCE if sentence is None else sentence
    if probe is None:
        check_sentence(text)
    model = shared_model(model_name)
    if model.attention_info(0).causal:
        made = None if probe is None else induction_probe_for(
            model, PROBE_LENGTH if probe_length is None else probe_length, PROBE_SEED if seed is None else seed)
        decoder_heads(model, model_name, None if made else text, made, output_format, precision, stream)
        return
    if probe is not None:
        raise OptionError(
            f"--probe {probe} needs a decoder ({', '.join(decoder_names())}): {model.name} is an encoder, and "
            "induction heads are how a decoder continues a text it has seen"
        )
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


def decoder_heads(
    model, model_arg: str, text: str | None, probe: Probe | None, output_format: str, precision: int, stream: TextIO
) -> None:
    """Run a decoder once on ``text`` or on ``probe``'s ids, score every head and print the result.

    ``model_arg`` is the model as the user named it (a folder, say), for the commands the text suggests.
    """
    with torch.no_grad():
        out = model(probe.ids if probe else text, output_attentions=True)  # one input: no padding
    ids = out.input_ids[0].tolist()
    tokens = out.tokens[0]
    readable = model.tokenizer.readable(ids) if model.tokenizer is not None else tokens
    attentions = torch.stack([layer[0] for layer in out.attentions])  # (layers, heads, seq, seq)
    roles = classify_decoder_heads(attentions, ids, first_row=0)  # every row: TransformerLens's scores
    probe_scores = None if probe is None else induction_probe_score(attentions, probe.length, probe.offset)  # (layers, heads)
    data = decoder_heads_to_dict(model.name, text, probe, ids, tokens, readable, roles, probe_scores)
    if output_format == "json":
        write_json(data, stream)
        return
    windows = [model.attention_info(layer).window for layer in range(len(roles))]
    blind = [layer for layer, w in enumerate(windows) if probe is not None and w is not None and w < probe.length]
    doc = decoder_heads_document(data, precision, str(model_arg), blind)
    write_document(doc, f"Attention heads of {model.name}", output_format, stream)
