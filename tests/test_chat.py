"""Chat: a conversation laid out by the model's own template, against transformers' apply_chat_template.

A tiny Llama folder (tests/tiny_models.py) given a template written here, in
tokenizer_config.json or as chat_template.jinja (where transformers 5 saves it); the
ids must equal transformers' tokenizer's, with and without a system message. SmolLM2's
own template from its GGUF file is checked in tests/test_smollm2.py.
"""

from __future__ import annotations

import json

import pytest

import selfattn as sa
from selfattn.errors import ModelError, OptionError
from selfattn.models.chat import render_chat

transformers = pytest.importorskip("transformers")

TEMPLATE = (
    "{% for message in messages %}{{ '<s>' if loop.first else '' }}[{{ message['role'] | upper }}] "
    "{{ message['content'] | trim }}\n{% endfor %}{% if add_generation_prompt %}[ASSISTANT]{% endif %}"
)
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "  the cat sat  "},
        {"role": "assistant", "content": "on the mat"}, {"role": "user", "content": "and then?"}]


@pytest.fixture(scope="module", params=["tokenizer_config", "jinja_file"])
def folder(request, tmp_path_factory):
    from tiny_models import tiny_checkpoint

    folder = tiny_checkpoint("llama", tmp_path_factory.mktemp(request.param))
    if request.param == "jinja_file":
        (folder / "chat_template.jinja").write_text(TEMPLATE, encoding="utf-8")
    else:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        (folder / "tokenizer_config.json").write_text(json.dumps(dict(config, chat_template=TEMPLATE)), encoding="utf-8")
    return folder


@pytest.mark.parametrize("messages", [CHAT, CHAT[1:2]], ids=["conversation", "one message"])
def test_chat_ids_equal_transformers_apply_chat_template(folder, messages):
    model = sa.load_pretrained(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    want = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert model.chat_template == TEMPLATE and model.chat_ids(messages) == list(want)


def test_chat_generates_after_the_laid_out_ids(folder):
    model = sa.load_pretrained(folder)  # 64 positions: one short message
    answer = model.chat(CHAT[1:2], max_new_tokens=5)
    assert answer.prompt_ids[0] == model.chat_ids(CHAT[1:2])
    assert answer.ids[0] == model.generate([model.chat_ids(CHAT[1:2])], max_new_tokens=5).ids[0]


def test_a_model_without_a_template_says_so_in_one_line():
    model = sa.load_pretrained("tiny-induction")
    with pytest.raises(ModelError) as caught:
        model.chat([{"role": "user", "content": "hi"}])
    assert "no chat template" in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("messages, words", [
    ("hi", "non-empty list"),
    ([], "non-empty list"),
    ([{"role": "user"}], "message 0 must be a dict with a text 'content'"),
    ([{"role": "robot", "content": "hi"}], "message 0 has role 'robot'"),
    ([{"role": "user", "content": "hi"}, "bye"], "message 1 must be a dict"),
])
def test_malformed_messages_are_one_line(messages, words):
    with pytest.raises(OptionError) as caught:
        render_chat(TEMPLATE, messages)
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_a_template_that_raises_is_a_model_error():
    template = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('the first message must be the user') }}{% endif %}"
    with pytest.raises(ModelError, match="chat template failed: the first message must be the user"):
        render_chat(template, [{"role": "system", "content": "x"}])
    assert render_chat(template, [{"role": "user", "content": "x"}]) == ""
