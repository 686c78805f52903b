"""``selfattn generate``: a decoder continues a prompt; ``explain.generation`` writes what it chose.

The text (or JSON) goes to ``stream``, stdout in the CLI; a note that the context window
slid goes to ``notes``, stderr unless given, after the text, so ``> out.txt`` holds only the
prompt and its continuation.
"""

from __future__ import annotations

import json
import sys
from typing import TextIO

from selfattn.commands.model_options import check_generate_options, not_a_decoder
from selfattn.render.text.generation_report import Streamer, generation_to_dict, window_note
from selfattn.models.decoder import DecoderModel
from selfattn.models.loading import shared_model


def generate_command(
    prompt: str,
    model_name: str,
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    seed: int | None,
    output_format: str,
    stream: TextIO,
    notes: TextIO | None = None,
    chat: str | None = None,
    system: str | None = None,
) -> None:
    """Run one generation and write it to ``stream``; options are checked before the model loads.

    With ``chat`` (a message; ``system`` before it) the model's chat template lays the
    conversation out and the answer alone is written (JSON: the laid-out text as the prompt,
    and the messages). With text output, a generation that passed the model's positions adds
    one note line on ``notes`` (None: ``sys.stderr``); JSON says it in ``window_slid_at``.
    """
    check_generate_options(model_name, max_new_tokens, temperature, top_k, top_p, seed)
    model = shared_model(model_name)
    if not isinstance(model, DecoderModel):
        raise not_a_decoder(model.name)
    messages = None
    if chat is not None:
        messages = ([{"role": "system", "content": system}] if system is not None else []) + [{"role": "user", "content": chat}]
        ids = model.chat_ids(messages)
        source, shown = [ids], model.tokenizer.decode(ids)
    else:
        source, shown = prompt, prompt
    live = output_format == "text" and stream.isatty()
    if live and chat is None:
        stream.write(prompt)
        stream.flush()
    prompt_ids = source[0] if chat is not None else model.tokenize(prompt).input_ids[0].tolist()
    printer = Streamer(model, stream, prompt_ids) if live else None
    result = model.generate(
        source, max_new_tokens, temperature, top_k, top_p, seed, on_token=printer.add if printer else None
    )
    if output_format == "json":
        record = generation_to_dict(model, shown, result, temperature, top_k, top_p, seed)
        if messages is not None:
            record["messages"] = messages
        stream.write(json.dumps(record, indent=2) + "\n")
    elif live:
        stream.write(result.text[0][len(printer.shown):] + "\n")  # whatever the stream held back
    else:
        stream.write((prompt if chat is None else "") + result.text[0] + "\n")
    note = window_note(model, result) if output_format == "text" else None
    if note is not None:
        stream.flush()  # the text first, when both go to one terminal
        print(note, file=notes if notes is not None else sys.stderr)
