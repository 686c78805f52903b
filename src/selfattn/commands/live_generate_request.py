"""The body of POST /api/generate, checked: every field in range before any model runs.

    generate_request(models, body) -> GenerateRequest     a RequestError (4xx, one line) says what is wrong

The bounds here are also what /openapi.json states (``selfattn.serve.schema`` reads them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from selfattn.commands.live import (
    MAX_SEED, MAX_TEXT_CHARS, LiveModels, RequestError, fields_of, json_type, number, shown, text_field, whole,
)

GENERATE_FIELDS = ("model", "text", "messages", "max_new_tokens", "temperature", "top_k", "top_p", "seed", "ablate",
                   "first_step", "layers", "heads")
MAX_LIVE_NEW_TOKENS = 512  # one request's tokens: every step keeps a forward's attention rows
MAX_TEMPERATURE = 10.0
TOP_SHOWN = 10  # next-token candidates per step
DEFAULT_SEED = 0  # sampling is seeded unless the body says otherwise: the same page, the same text
# Attention numbers one answer may carry (steps x layers x heads x keys, about 80 MB of JSON):
# past it a browser slows to a crawl. A page that steps asks with first_step for the new ones only.
MAX_STEP_NUMBERS = 1 << 22


@dataclass(frozen=True)
class GenerateRequest:
    """A checked body of POST /api/generate."""

    model: str
    text: str | None  # the prompt; None in a chat, whose prompt is ``messages`` laid out by the model's template
    max_new_tokens: int
    temperature: float
    top_k: int | None
    top_p: float | None
    seed: int
    ablate: tuple[tuple[int, int], ...]
    first_step: int = 0  # steps before it are left out of the answer (the page has them already)
    messages: tuple[tuple[str, str], ...] | None = None  # a chat: (role, content) pairs, the user's last
    layers: tuple[int, ...] | None = None  # the layers each step's attention holds, in this order (None: all)
    heads: tuple[int, ...] | None = None  # the heads of each of those layers (None: all)


def indices(body: Any, name: str, count: int) -> tuple[int, ...] | None:
    """body[name]: "all" or absent (None: every one), or a list of distinct whole numbers from 0 to count - 1."""
    value = body.get(name)
    if value is None or value == "all":
        return None
    if (not isinstance(value, list) or len(set(map(repr, value))) != len(value)
            or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < count for i in value)):
        raise RequestError(f'{name} must be "all" or a list of distinct whole numbers from 0 to {count - 1}, '
                           f"got {shown(value)}")
    return tuple(value)


def chat_messages(value: Any) -> tuple[tuple[str, str], ...]:
    """The body's ``messages``: a non-empty list of {"role", "content"} objects ending with the user's."""
    from selfattn.models.chat import ROLES

    shape = 'messages must be a non-empty list of {"role": ..., "content": ...} objects'
    if not isinstance(value, list) or not value:
        raise RequestError(f"{shape}, got {shown(value)}")
    pairs = []
    for index, message in enumerate(value):
        if not isinstance(message, dict) or set(message) != {"role", "content"}:
            raise RequestError(f"{shape}; message {index} is {shown(message)}")
        role, content = message["role"], message["content"]
        if role not in ROLES:
            raise RequestError(f"message {index} has role {shown(role)}: the roles are {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise RequestError(f"message {index}'s content must be a string, got {json_type(content)}")
        pairs.append((role, content))
    if pairs[-1][0] != "user" or not pairs[-1][1].strip():
        raise RequestError("the last message must be the user's, with some text: the model answers it")
    total = sum(len(content) for _, content in pairs)
    if total > MAX_TEXT_CHARS:
        raise RequestError(f"the messages have {total} characters; the live app takes at most {MAX_TEXT_CHARS}")
    return tuple(pairs)


def generate_request(models: LiveModels, body: Any) -> GenerateRequest:
    """The body checked, every field in range (a ``RequestError`` says which is not)."""
    fields = fields_of(body, GENERATE_FIELDS, "generate")
    name = models.resolve(fields.get("model"))
    messages = None
    if fields.get("messages") is not None:
        if fields.get("text") is not None:
            raise RequestError("give text (a prompt) or messages (a chat), not both")
        messages, text = chat_messages(fields["messages"]), None
    else:
        text = text_field(fields)
    ablate = fields.get("ablate") or []
    if not isinstance(ablate, list) or not all(
        isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in pair)
        for pair in ablate
    ):
        raise RequestError(f"ablate must be a list of [layer, head] pairs of whole numbers, got {shown(ablate)}")
    return GenerateRequest(
        model=name,
        text=text,
        max_new_tokens=whole(fields, "max_new_tokens", 1, MAX_LIVE_NEW_TOKENS, 20),
        temperature=number(fields, "temperature", 0.0, MAX_TEMPERATURE, 0.0),
        top_k=whole(fields, "top_k", 1, None),
        top_p=number(fields, "top_p", 0.0, 1.0, low_open=True),
        seed=whole(fields, "seed", 0, MAX_SEED, DEFAULT_SEED),
        ablate=tuple((layer, head) for layer, head in ablate),
        first_step=whole(fields, "first_step", 0, MAX_LIVE_NEW_TOKENS, 0),
        messages=messages,
        layers=indices(fields, "layers", models.outline(name).layers),
        heads=indices(fields, "heads", models.outline(name).heads),
    )
