"""The live app's work (``selfattn serve``): the models it offers and what each API call computes.

The web layer (``selfattn.serve``) only moves JSON: it hands each request's body to one
function here and writes back what it returns. Everything a body may ask for is checked
here first, with one clear ``RequestError`` (a 4xx status and a line of text), before any
model runs. A body names models only by the names ``LiveModels`` offers: nothing the
browser sends is ever read as a file or a folder.

    GET  /api/variants   variant_names()                the variants and positional encodings explain takes
    POST /api/explain    explain_json(models, body)     the JSON of ``selfattn explain --format json``
    POST /api/attention  attention_json(models, body)   one head's (or a layer's) full weights
    GET  /explorer       explorer_page(models, fields)  the explorer page of ``selfattn view``
    POST /api/generate   live_generation.LiveGeneration(models, generate_request(models, body))
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from selfattn.commands.explain_options import MAX_D_K, MAX_HEADS, ExplainConfig
from selfattn.commands.traces import build_trace
from selfattn.errors import ModelError, SelfAttnError
from selfattn.formatting import MAX_PRECISION, MIN_PRECISION
from selfattn.models.files import MODELS
from selfattn.models.outline import ModelOutline, model_outline, outline_of
from selfattn.pipeline.embedding_options import MAX_DIM, MIN_DIM

BUILT_IN = tuple(MODELS)  # the models every server offers
MAX_TEXT_CHARS = 20_000  # a text longer than this is refused before it is tokenised
# /api/attention with every head of a layer: heads x tokens^2 numbers at most (about 40 MB of JSON).
MAX_LAYER_CELLS = 1 << 21
MAX_SEED = 2**63 - 1  # a request's seed: torch's generators take up to 64 bits


class RequestError(SelfAttnError):
    """A request the server refuses: ``status`` (4xx) and one line saying why."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class LiveModels:
    """The models one server offers, each loaded on first use and kept for the server's life.

    Args:
        extra: models named on the command line (``--model``): a name, folder, llama2.c
            checkpoint or cached hub id, as ``load_pretrained`` takes them. Each is
            resolved now, so a typo stops the server before it starts.

    Raises:
        ModelError: an extra model cannot be resolved.
    """

    def __init__(self, extra: Sequence[str] = ()) -> None:
        from selfattn.models.locate import model_key

        self._keys: dict[str, str] = {}
        for name in (*BUILT_IN, *extra):
            key = model_key(name)
            if key not in self._keys.values():
                self._keys[name] = key
        self._loaded: dict[str, Any] = {}
        self._outlines: dict[str, ModelOutline] = {}
        # One computation per model at a time: ablation hooks live on the shared model for one
        # request. The seed's walkthrough (no model) takes a lock of its own, so that two models,
        # or a model and the walkthrough, compute side by side.
        self._locks = {name: threading.RLock() for name in (*self._keys, None)}

    @property
    def names(self) -> list[str]:
        """The names offered, built-in ones first."""
        return list(self._keys)

    def resolve(self, name: Any) -> str:
        """``name`` if this server offers it, else a 404 ``RequestError`` listing what it offers."""
        if not isinstance(name, str) or name not in self._keys:
            raise RequestError(f"unknown model {shown(name)}: this server offers {', '.join(self._keys)}", 404)
        return name

    def using(self, name: str | None) -> threading.RLock:
        """The lock a computation with model ``name`` holds (None: the seed's, without a model)."""
        return self._locks[None if name is None else self.resolve(name)]

    def model(self, name: str):
        """The model offered as ``name``, loaded on first use."""
        name = self.resolve(name)
        with self.using(name):
            if name not in self._loaded:
                from selfattn.models.pretrained import load_pretrained

                self._loaded[name] = load_pretrained(self._keys[name])
            return self._loaded[name]

    def is_loaded(self, name: str) -> bool:
        return name in self._loaded

    def outline(self, name: str) -> ModelOutline:
        """The model's sizes, from its config when it has not loaded yet."""
        name = self.resolve(name)
        if name not in self._outlines:
            loaded = self._loaded.get(name)
            self._outlines[name] = (outline_of(loaded.config, getattr(loaded, "gguf_types", None),
                                               bool(getattr(loaded, "chat_template", None)))
                                    if loaded is not None else model_outline(self._keys[name]))
        return self._outlines[name]

    def listing(self) -> dict[str, Any]:
        """GET /api/models: each offered model's name, kind and sizes."""
        entries = []
        for name in self._keys:
            try:
                outline = self.outline(name)
            except ModelError as error:  # e.g. MiniLM's package not installed: say so, keep the rest
                entries.append({"name": name, "error": " ".join(str(error).split())})
                continue
            entries.append({"name": name, "kind": outline.kind, "layers": outline.layers, "heads": outline.heads,
                            "kv_heads": outline.kv_heads, "positions": outline.positions,
                            "loaded": self.is_loaded(name)})
            if outline.kind == "decoder":  # tuned for chat: the page offers its chat mode
                entries[-1]["chat"] = outline.chat
            if outline.weight_blocks:  # a GGUF file's block types: the weights were quantized (Q4_1, ...)
                entries[-1]["weights"] = dict(outline.weight_blocks)
        return {"models": entries}


# ---- reading a body --------------------------------------------------------------------
# A refusal speaks the API's words: the field's name, JSON's types (null, boolean, number,
# string, array, object) and the value as JSON writes it, never a CLI flag or a Python type.

def json_type(value: Any) -> str:
    """The JSON name of a parsed value's type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, (list, tuple)) else "object"


def shown(value: Any, most: int = 80) -> str:
    """A value as JSON writes it, cut to about ``most`` characters."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= most else text[: most - 1] + "…"


def fields_of(body: Any, allowed: Sequence[str], what: str) -> dict[str, Any]:
    """The body as a dict with known keys only (a 400 for anything else)."""
    if not isinstance(body, Mapping):
        raise RequestError(f"{what} takes a JSON object, got {json_type(body)}")
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise RequestError(f"{what} has no field {shown(unknown[0])}; its fields are {', '.join(allowed)}")
    return dict(body)


def whole(body: Mapping, name: str, low: int, high: int | None, default: Any = None) -> Any:
    """body[name] as a whole number in [low, high] (None: no upper end), or ``default`` when absent or null."""
    value = body.get(name)
    if value is None:
        return default
    top = "" if high is None else f" to {high}"
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        raise RequestError(f"{name} must be a whole number from {low}{top}, got {shown(value)}")
    return value


def number(body: Mapping, name: str, low: float, high: float, default: Any = None, low_open: bool = False) -> Any:
    """body[name] as a finite number in [low, high] ((low, high] with ``low_open``), or ``default``."""
    value = body.get(name)
    if value is None:
        return default
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or value > high or value < low or (low_open and value == low)):
        bracket = "(" if low_open else "["
        raise RequestError(f"{name} must be a number in {bracket}{low:g}, {high:g}], got {shown(value)}")
    return float(value)


def text_field(body: Mapping, name: str = "text", required: bool = True) -> str | None:
    """body[name] as a non-empty string of at most ``MAX_TEXT_CHARS`` characters."""
    value = body.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise RequestError(f"{name} must be a string, got {json_type(value)}" if name in body else
                           f"{name} is missing: send it as a string")
    if not value.strip():
        raise RequestError(f"{name} is empty: type some text")
    if len(value) > MAX_TEXT_CHARS:
        raise RequestError(f"{name} has {len(value)} characters; the live app takes at most {MAX_TEXT_CHARS}")
    return value


def check_head(outline: ModelOutline, layer: int | None, head: int | None) -> None:
    """A 400 for a layer or head the model does not have (None passes)."""
    if layer is not None and layer >= outline.layers:
        raise RequestError(f"layer {layer} is out of range: this model has {outline.layers} layers, 0 to {outline.layers - 1}")
    if head is not None and head >= outline.heads:
        raise RequestError(f"head {head} is out of range: this model has {outline.heads} heads, 0 to {outline.heads - 1}")


# ---- /api/explain and /explorer ---------------------------------------------------------

# ExplainConfig's fields the browser may set ("text" is the sentence); never "embeddings",
# which names a file.
EXPLAIN_FIELDS = ("text", "query", "variant", "positional", "heads", "kv_heads", "d_k", "block_size", "embed",
                  "dim", "seed", "precision", "model", "layer", "head")
EXPLAIN_NAMES = ("variant", "positional", "embed", "model")  # its fields that take a name (a string)
# Its whole-number fields, each from low to high (None: no upper end): ExplainConfig's own
# bounds, checked here first so that a refusal names the field and JSON's types.
EXPLAIN_WHOLE = {"heads": (1, MAX_HEADS), "kv_heads": (1, MAX_HEADS), "d_k": (1, MAX_D_K), "block_size": (1, None),
                 "dim": (MIN_DIM, MAX_DIM), "seed": (0, MAX_SEED), "precision": (MIN_PRECISION, MAX_PRECISION),
                 "layer": (0, None), "head": (0, None)}
_FLAG = re.compile(r"(?<![\w'\"-])--([a-z][a-z-]*)")


@contextmanager
def in_api_words() -> Iterator[None]:
    """The library's refusals as the API says them: a CLI flag (``--kv-heads``) becomes the
    body's field (``kv_heads``); the message is otherwise the library's, so the two agree."""
    try:
        yield
    except RequestError:
        raise
    except SelfAttnError as error:
        def field(flag: re.Match) -> str:
            name = flag.group(1).replace("-", "_")
            return name if name in (*EXPLAIN_FIELDS, "embeddings", "format") else flag.group(0)

        raise RequestError(_FLAG.sub(field, str(error)), getattr(error, "status", 400)) from None


def explain_config(models: LiveModels, body: Any, output_format: str) -> ExplainConfig:
    """The ``ExplainConfig`` a request's fields ask for (400 on a bad field, 404 on an unknown model)."""
    if isinstance(body, Mapping) and "embeddings" in body:
        raise RequestError('embeddings names a file, which the live app never reads: use embed "seed" or "random"')
    if isinstance(body, Mapping) and "format" in body:  # explain's flag: the API answers in JSON only
        if body["format"] not in (None, "json"):
            raise RequestError(f'format must be "json" here (the API answers in JSON), got {shown(body["format"])}')
        body = {name: value for name, value in body.items() if name != "format"}
    fields = fields_of(body, EXPLAIN_FIELDS, "explain")
    sentence = text_field(fields, required=False)
    fields.pop("text", None)
    if fields.get("model") is not None:
        models.resolve(fields["model"])
    query = fields.get("query")
    if query is not None and (isinstance(query, bool) or not isinstance(query, (str, int))):
        raise RequestError(f"query must be a token (a string) or a position (a whole number), got {shown(query)}")
    options = {name: value for name, value in fields.items() if value is not None}
    for name in EXPLAIN_NAMES:
        if name in options and not isinstance(options[name], str):
            raise RequestError(f"{name} must be a string, got {json_type(options[name])}")
    for name, (low, high) in EXPLAIN_WHOLE.items():
        whole(options, name, low, high)
    with in_api_words():
        return ExplainConfig(sentence=sentence, format=output_format, **options)


def variant_names() -> dict[str, list[str]]:
    """GET /api/variants: the names explain's ``variant`` and ``positional`` take, in order."""
    from selfattn.positional import POSITIONAL_NAMES
    from selfattn.trace.variant_names import VARIANTS

    return {"variants": list(VARIANTS), "positional": list(POSITIONAL_NAMES)}


def explain_json(models: LiveModels, body: Any) -> str:
    """POST /api/explain: exactly what ``selfattn explain --format json`` prints for these options."""
    from selfattn.render.text.json_out import render_json

    config = explain_config(models, body, "json")
    with models.using(config.model), in_api_words():
        model = models.model(config.model) if config.model is not None else None
        return render_json(build_trace(config, model))


def explorer_page(models: LiveModels, body: Any) -> str:
    """GET /explorer: the explorer page ``selfattn view`` writes for these options (a model's layer and head)."""
    from selfattn.render.visual.explorer import explorer_html

    fields = dict(body) if isinstance(body, Mapping) else body
    picked = {}
    if isinstance(fields, dict) and fields.get("model") is None:  # a variant's head is picked on the page, as view's
        picked = {name: whole(fields, name, 0, None, 0) for name in ("layer", "head")}
        fields.pop("layer", None)
        fields.pop("head", None)
    config = explain_config(models, fields, "html")
    with models.using(config.model), in_api_words():
        model = models.model(config.model) if config.model is not None else None
        trace = build_trace(config, model)
    layer, head = (picked["layer"], picked["head"]) if picked else (config.layer or 0, config.head or 0)
    if model is None:
        from selfattn.commands.plot_options import check_shown_head

        with in_api_words():
            check_shown_head(layer, head, trace.n_layers, trace.n_heads)
    return explorer_html(trace, config.precision, head=head, layer=layer)


# ---- /api/attention ---------------------------------------------------------------------

ATTENTION_FIELDS = ("model", "text", "layer", "head")


def attention_json(models: LiveModels, body: Any) -> dict[str, Any]:
    """POST /api/attention: a head's full weight matrix (rows are queries), or every head of a layer.

    ``head`` null or "all" gives ``weights`` as [heads][queries][keys]. Besides the contract's
    ``tokens`` and ``weights`` the answer says how to read them: each token's label, the
    layer's mask as a range of keys per query, RoPE or learned positions, and which
    key/value head each query head reads.
    """
    import torch

    fields = fields_of(body, ATTENTION_FIELDS, "attention")
    name = models.resolve(fields.get("model"))
    text = text_field(fields)
    outline = models.outline(name)
    layer = whole(fields, "layer", 0, None, 0)
    every = fields.get("head") in (None, "all")
    head = None if every else fields["head"]
    if not every and (isinstance(head, bool) or not isinstance(head, int) or head < 0):
        raise RequestError(f'head must be "all" or a whole number from 0, got {shown(head)}')
    check_head(outline, layer, head)
    with models.using(name):
        model = models.model(name)
        with torch.no_grad():
            out = model(text, output_attentions=True)
    tokens = out.tokens[0]
    n = len(tokens)
    if every and outline.heads * n * n > MAX_LAYER_CELLS:
        raise RequestError(f"the text has {n} tokens: every head of a layer at once takes at most "
                           f"{int((MAX_LAYER_CELLS / outline.heads) ** 0.5)}; pick one head")
    weights = out.attentions[layer][0, :, -n:, -n:]  # (heads, n, n); a decoder pads on the left
    return {
        "model": name,
        "layer": layer,
        "head": "all" if every else head,
        "tokens": tokens,
        "labels": labels_of(model, out.input_ids[0, -n:].tolist(), tokens),
        "weights": weights.tolist() if every else weights[head].tolist(),
        "kind": outline.kind,
        **layer_facts(model.attention_info(layer), n),
    }


def labels_of(model, ids: list[int], tokens: list[str]) -> list[str]:
    """The page's label of each token: what it reads as ('␣cat' where a byte-level vocabulary
    writes 'Ġcat'), from the model's tokenizer; as written when the model has none."""
    from selfattn.render.visual.token_labels import token_labels

    tokenizer = getattr(model, "tokenizer", None)
    return token_labels(tokens, None if tokenizer is None else tokenizer.readable(ids))


def layer_facts(info, n: int) -> dict[str, Any]:
    """What the page draws beside the weights, from the layer's ``AttentionInfo``: the mask as
    each query's range of keys, the positions, the shared key/value heads."""
    window = info.window
    ranges = [[max(0, i + 1 - window) if window else 0, i + 1 if info.causal else n] for i in range(n)]
    return {
        "causal": info.causal,
        "window": window,
        "mask_ranges": ranges,
        "positional": info.positional,
        "rope_base": info.rope_base,
        "kv_heads": info.n_kv_heads,
        "kv_head_of": [info.kv_head(h) for h in range(info.n_heads)],
    }
