"""``selfattn heads``: what every head of a pretrained model does on a sentence, a file of texts, or a probe.

Run the model and score every layer's every head: an encoder's heads get
``head_roles``'s roles (previous, next, self, [CLS]/[SEP]); a decoder's (causal) heads get
``decoder_roles``'s pattern scores (previous token, duplicate token, induction, first
token), on the sentence or on the induction probe (``--probe induction``). ``--texts FILE``
averages every score over the file's texts, with its spread (``analysis.head_runs``);
``--ablation`` adds each decoder head's loss change when it alone is zeroed
(``analysis.interventions``). The tables and JSON are written by ``explain.encoder_heads``
and ``explain.decoder_heads``.
"""

from __future__ import annotations

from typing import TextIO

import torch

from selfattn.analysis.decoder_roles import classify_decoder_heads, induction_probe_score
from selfattn.analysis.head_roles import classify_heads
from selfattn.analysis.head_runs import DecoderRun, decoder_over_texts, encoder_over_texts, probe_roles
from selfattn.analysis.head_interventions import ablation_losses
from selfattn.analysis.next_token import probe_positions, text_positions
from selfattn.analysis.inputs import PROBE_LENGTH, PROBE_SEED
from selfattn.analysis.probes import Probe, induction_probe_for
from selfattn.errors import OptionError, SentenceError
from selfattn.commands.model_options import check_heads_options
from selfattn.render.text.command_output import write_document, write_json
from selfattn.render.text.decoder_heads import decoder_heads_document, decoder_heads_to_dict, decoder_texts_to_dict
from selfattn.render.text.encoder_heads import encoder_texts_document, encoder_texts_to_dict, heads_document, heads_to_dict
from selfattn.models.loading import shared_model
from selfattn.models.registry import decoder_names
from selfattn.pipeline.embedding_options import SEED_SENTENCE


def heads_command(
    sentence: str | None, model_name: str, output_format: str, precision: int, stream: TextIO,
    probe: str | None = None, probe_length: int | None = None, seed: int | None = None,
    ablation: bool = False, texts_file: str | None = None,
) -> None:
    """Classify every head of ``model_name`` on one sentence, several texts, or a probe, and print the table.

    Args:
        sentence: the text to run the model on; None for the seed's sentence (or the probe).
        model_name: a pretrained model's name, e.g. "all-MiniLM-L6-v2", or a model folder.
        output_format: "text", "markdown" or "json".
        precision: decimals for the numbers in text and markdown.
        stream: where to write.
        probe: None, or "induction": a decoder reads random tokens repeated twice instead of a sentence.
        probe_length: the random tokens in one copy of the probe (default PROBE_LENGTH); needs ``probe``.
        seed: the seed of the probe's tokens (default PROBE_SEED); needs ``probe``.
        ablation: a decoder's heads also get the change of the loss when each alone is zeroed.
        texts_file: a file of texts, one a line: every score averaged over them, with its spread.

    Raises:
        OptionError: an unknown format, precision or probe; a probe with a sentence, on an
            encoder, or longer than the model's positions; probe_length or seed without a
            probe; --texts with a sentence or a probe; --ablation on an encoder; a texts
            file that cannot be read or holds no text.
        SentenceError: the sentence is not a non-empty string, or too long for the model.
    """
    texts = check_heads_options(sentence, model_name, output_format, precision, probe, probe_length, seed, texts_file)
    text = SEED_SENTENCE if sentence is None else sentence
    model = shared_model(model_name)
    if model.attention_info(0).causal:
        made = None if probe is None else induction_probe_for(
            model, PROBE_LENGTH if probe_length is None else probe_length, PROBE_SEED if seed is None else seed)
        inputs = texts if texts is not None else None if made else [text]
        decoder_heads(model, model_name, inputs, made, output_format, precision, stream, ablation, texts_file)
        return
    if probe is not None:
        raise OptionError(
            f"--probe {probe} needs a decoder ({', '.join(decoder_names())}): {model.name} is an encoder, and "
            "induction heads are how a decoder continues a text it has seen"
        )
    if ablation:
        raise OptionError(
            f"--ablation reads the next-token loss, which only a decoder has: {model.name} is an encoder")
    encoder_heads(model, texts if texts is not None else [text], sentence is None and texts is None, output_format,
                  precision, stream, texts_file)


def encoder_heads(model, texts: list[str], is_seed: bool, output_format: str, precision: int, stream: TextIO,
                  texts_file: str | None) -> None:
    """An encoder's head roles on one sentence, or averaged over several texts."""
    runs = []
    for index, text in enumerate(texts):
        with torch.no_grad():
            out = _named(texts_file, index, lambda: model(text, output_attentions=True))  # > 512 tokens is refused
        attentions = torch.stack([layer[0] for layer in out.attentions])  # (layers, heads, n, n)
        runs.append((text, out.tokens[0], classify_heads(attentions, out.tokens[0])))
    if texts_file is not None:
        data = encoder_texts_to_dict(model.name, texts_file, texts, encoder_over_texts([r for _, _, r in runs]))
        if output_format == "json":
            write_json(data, stream)
            return
        write_document(encoder_texts_document(data, precision), f"Attention heads of {model.name}", output_format, stream)
        return
    text, tokens, roles = runs[0]
    if output_format == "json":
        write_json(heads_to_dict(model.name, text, tokens, roles), stream)
        return
    doc = heads_document(model.name, text, tokens, roles, precision, is_seed)
    write_document(doc, f"Attention heads of {model.name}", output_format, stream)


def decoder_heads(
    model, model_arg: str, texts: list[str] | None, probe: Probe | None, output_format: str, precision: int,
    stream: TextIO, ablation: bool = False, texts_file: str | None = None,
) -> None:
    """Run a decoder on each text (or on ``probe``'s ids), score every head and print the result.

    ``model_arg`` is the model as the user named it (a folder, say), for the commands the text suggests.
    """
    inputs = [probe.ids] if probe is not None else texts
    runs = [_named(texts_file, index, lambda: decoder_run(model, given, probe, ablation))
            for index, given in enumerate(inputs)]
    if texts_file is not None:
        data = decoder_texts_to_dict(model.name, texts_file, texts, decoder_over_texts(runs), runs[0].loss is not None)
    else:
        data = decoder_heads_to_dict(model.name, None if probe else texts[0], probe, *runs[0])
    if output_format == "json":
        write_json(data, stream)
        return
    windows = [model.attention_info(layer).window for layer in range(model.config.n_layers)]
    blind = [layer for layer, w in enumerate(windows) if probe is not None and w is not None and w < probe.length]
    doc = decoder_heads_document(data, precision, str(model_arg), blind)
    write_document(doc, f"Attention heads of {model.name}", output_format, stream)


def decoder_run(model, given, probe: Probe | None, ablation: bool) -> DecoderRun:
    """One input through a decoder: its tokens, every head's scores and role, and with ``ablation`` each head's loss change."""
    encoded = model.tokenize(given)  # one input: no padding
    ids = encoded.input_ids[0].tolist()
    tokens = encoded.tokens[0]
    readable = model.tokenizer.readable(ids) if model.tokenizer is not None else tokens
    roles, probe_rows = [], []
    for weights in _layer_weights(model, encoded):  # (heads, seq, seq), one layer at a time
        roles += classify_decoder_heads([weights], ids, first_row=0)  # every row: TransformerLens's scores
        if probe is not None:
            probe_rows.append(induction_probe_score(weights, probe.length, probe.offset))  # (heads,)
    probe_scores = None
    if probe is not None:
        probe_scores = torch.stack(probe_rows)  # (layers, heads)
        roles = probe_roles(roles, probe_scores)
    delta = loss = None
    if ablation:
        positions = probe_positions(probe.length, probe.offset) if probe is not None else text_positions(len(ids))
        loss, after = ablation_losses(model, model.tokenize(given), positions)
        delta = after - loss  # (layers, heads)
    return DecoderRun(ids, tokens, readable, roles, probe_scores, delta, loss)


def _layer_weights(model, encoded):
    """Every layer's attention weights (heads, seq, seq) on one input, a layer at a time.

    While every layer's weights fit ``FULL_TRACE_CELLS`` they come from one forward pass that
    returns them all; past it (SmolLM2 beyond about 350 tokens) from the hidden states, each
    layer's attention taken again through the tiled kernel and its weights rebuilt from the
    softmax's log-sum-exp, so only one layer's n x n weights are held at once.
    """
    from selfattn.trace.model_layers import FULL_TRACE_CELLS, layer_rows

    n, layers = encoded.input_ids.shape[1], len(model.blocks)
    with torch.no_grad():
        if layers * model.attention_info(0).n_heads * n * n <= FULL_TRACE_CELLS:
            yield from (layer[0] for layer in model.run(encoded, output_attentions=True).attentions)
            return
        hidden = model.run(encoded, output_hidden_states=True).hidden_states  # layers + 1 of (1, seq, d)
        shared: dict = {}
        for layer in range(layers):
            yield layer_rows(model, layer, hidden, n, shared).weights


def _named(texts_file: str | None, index: int, run):
    """run(), with a text's refusal naming its line of the --texts file."""
    if texts_file is None:
        return run()
    try:
        return run()
    except SentenceError as error:
        raise SentenceError(f"--texts {texts_file}, text {index + 1}: {error}") from None
