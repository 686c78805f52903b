"""``selfattn generate``: a decoder continues a prompt, streamed in a terminal, or as JSON.

Text: the prompt, then the new text as each token is chosen when stdout is a terminal
(all at once when piped, so a file gets the same clean text). JSON: the prompt and its
ids, the new tokens and ids, the text, and for every step the five most likely next
tokens with their probabilities.
"""

from __future__ import annotations

import json
from typing import TextIO

from selfattn.errors import ModelError
from selfattn.models.generation import _check_options


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
) -> None:
    """Run one generation and write it to ``stream``; options are checked before the model loads."""
    _check_options(max_new_tokens, temperature, top_k, top_p, seed)
    from selfattn.models.decoder import DecoderModel
    from selfattn.models.loading import shared_model

    model = shared_model(model_name)
    if not isinstance(model, DecoderModel):
        raise ModelError(
            f"{model.name} is an encoder (BERT): it has no next-token head to generate with; "
            f"give a gpt2, llama, mistral or qwen2 model"
        )
    live = output_format == "text" and stream.isatty()
    if live:
        stream.write(prompt)
        stream.flush()
    printer = _Streamer(model, stream) if live else None
    result = model.generate(
        prompt, max_new_tokens, temperature, top_k, top_p, seed, on_token=printer.add if printer else None
    )
    if output_format == "json":
        stream.write(json.dumps(generation_to_dict(model, prompt, result, temperature, top_k, top_p, seed), indent=2) + "\n")
    elif live:
        stream.write(result.text[0][len(printer.shown):] + "\n")  # whatever the stream held back
    else:
        stream.write(prompt + result.text[0] + "\n")


def generation_to_dict(model, prompt: str, result, temperature, top_k, top_p, seed) -> dict:
    """The JSON of one prompt's generation."""
    readable = model.tokenizer.readable
    return {
        "model": model.name,
        "prompt": prompt,
        "prompt_ids": result.prompt_ids[0],
        "prompt_tokens": [model.tokenizer.token(i) for i in result.prompt_ids[0]],
        "tokens": result.tokens[0],
        "readable_tokens": readable(result.ids[0]),
        "ids": result.ids[0],
        "text": result.text[0],
        "settings": {"temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed,
                     "greedy": temperature == 0},
        "top": [
            [{"token": c.token, "readable": readable([c.id])[0], "id": c.id, "probability": c.probability} for c in step]
            for step in result.top[0]
        ],
    }


class _Streamer:
    """Writes each new piece of text as tokens arrive (decoding the whole so far, so bytes split
    across tokens come out whole)."""

    def __init__(self, model, stream: TextIO) -> None:
        self.model = model
        self.stream = stream
        self.ids: list[int] = []
        self.shown = ""

    def add(self, row: int, token: int) -> None:
        self.ids.append(token)
        text = self.model.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 character: wait for its next byte
            return
        self.stream.write(text[len(self.shown):])
        self.stream.flush()
        self.shown = text
