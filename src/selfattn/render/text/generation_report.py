"""What ``selfattn generate`` writes: the text streamed as tokens arrive, or the whole run as JSON.

Text: the prompt, then the new text as each token is chosen when stdout is a terminal
(all at once when piped, so a file gets the same clean text). When the text ran past the
model's positions, one note line says from which new token on the window slid; the
command writes it to stderr, after the text, so piped or redirected text stays only the
prompt and its continuation. JSON: the prompt and its ids, the new tokens and ids, the
text, ``window_slid_at`` (the 0-based step the window first slid at, or null), and for
every step the five most likely next tokens with their probabilities.
``commands.generate`` runs the model.
"""

from __future__ import annotations

from typing import TextIO

from selfattn.models.generation import kept_after_slide


def window_note(model, result) -> str | None:
    """The note line for a generation that ran past the model's positions; None if it fitted.

    One numbering: new tokens counted from 0, as ``window_slid_at`` and the JSON's ``ids`` count them.
    """
    slid = result.window_slid_at
    if slid is None:
        return None
    limit = model.config.max_positions
    kept = kept_after_slide(limit)
    seen = f"{kept} to {limit}" if kept < limit else f"{limit}"
    return (
        f"selfattn: note: the context window slid from new token {slid} on (new tokens counted from 0, as "
        f"window_slid_at): {model.name} has {limit} positions, so from there each token saw only the most recent "
        f"{seen} tokens"
    )


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
        "window_slid_at": result.window_slid_at,
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

    def __init__(self, model, stream: TextIO, prompt_ids: list[int] | None = None) -> None:
        self.model = model
        self.stream = stream
        self.prompt_ids = [] if prompt_ids is None else list(prompt_ids)  # what the new text follows
        self.ids: list[int] = []
        self.shown = ""

    def add(self, row: int, token: int) -> None:
        self.ids.append(token)
        text = self.model.tokenizer.continuation(self.prompt_ids, self.ids)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 character: wait for its next byte
            return
        self.stream.write(text[len(self.shown):])
        self.stream.flush()
        self.shown = text
