"""A conversation as the text a chat model was trained on, by the model's own template.

Instruction-tuned models keep a Jinja template (a GGUF file in ``tokenizer.chat_template``)
that lays the messages out with the model's turn markers, e.g. ``<|im_start|>user ...
<|im_end|>``, and, asked to, opens the assistant's turn for the model to continue. We render
it with Jinja2 the way transformers renders it (a sandboxed environment, blocks trimmed,
``raise_exception`` and a JSON filter for the templates that use them), so that the ids the
model sees are the ones transformers' ``apply_chat_template`` gives. No torch here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime

from selfattn.errors import ModelError, OptionError

ROLES = ("system", "user", "assistant")


def check_messages(messages) -> list[dict]:
    """Messages as a chat template reads them: a non-empty list of {"role", "content"} with text content.

    Raises:
        OptionError: anything else, naming the message at fault.
    """
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise OptionError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    checked = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("content"), str):
            raise OptionError(f"message {index} must be a dict with a text 'content', got {message!r}"[:200])
        if message.get("role") not in ROLES:
            raise OptionError(f"message {index} has role {message.get('role')!r}: use {', '.join(ROLES)}")
        checked.append({"role": message["role"], "content": message["content"]})
    return checked


def render_chat(template: str | None, messages, bos_token: str = "", eos_token: str = "",
                add_generation_prompt: bool = True) -> str:
    """The conversation's text by the model's template, the assistant's turn opened for the answer.

    Args:
        template: the model's Jinja chat template (None: the model has none).
        messages: [{"role": "system" | "user" | "assistant", "content": text}, ...].
        bos_token, eos_token: the texts of the model's first and end tokens, which templates may write.
        add_generation_prompt: open the assistant's turn at the end.

    Raises:
        ModelError: the model has no chat template, or its template fails on these messages.
        OptionError: the messages are malformed.
    """
    if not template:
        raise ModelError("this model has no chat template: it was not tuned for chat (give a plain prompt instead)")
    messages = check_messages(messages)
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=["jinja2.ext.loopcontrols"])
    environment.filters["tojson"] = lambda value, indent=None, **_: json.dumps(value, ensure_ascii=False, indent=indent)
    environment.globals.update(raise_exception=raise_exception, strftime_now=lambda f: datetime.now().strftime(f))
    try:
        return environment.from_string(template).render(
            messages=messages, bos_token=bos_token, eos_token=eos_token, add_generation_prompt=add_generation_prompt)
    except jinja2.exceptions.TemplateError as error:
        raise ModelError(f"the model's chat template failed: {error}") from None
