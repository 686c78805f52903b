"""What ``selfattn generate`` writes: the text streamed as tokens arrive, or the whole run as JSON.

Text: the prompt, then the new text as each token is chosen when stdout is a terminal
(all at once when piped, so a file gets the same clean text). JSON: the prompt and its
ids, the new tokens and ids, the text, and for every step the five most likely next
tokens with their probabilities. ``commands.generate`` runs the model.
"""

from __future__ import annotations

from typing import TextIO



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


class Streamer:
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
