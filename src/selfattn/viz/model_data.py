"""The explorer's data for a pretrained model: every layer's and head's weights, within a size budget.

A model page carries far more numbers than a toy one: all-MiniLM-L6-v2 has 6 layers of
12 heads, each an n x n matrix. What goes in, largest first while it fits:
  weights   every layer's heads; else the selected layer's heads; else the selected head.
  steps     (scores, scaled scores, exp, context) the selected head always; then every
            embedded head if they all fit, else the selected layer's heads if they fit.
  vectors   each layer's output hidden state, first VECTOR_PREVIEW of its d numbers.
Sizes are measured as the page's JSON: the selected head's numbers exactly, the rest
estimated from it, so a 64-token sentence with all 6 x 12 heads stays under 3 MB.

Steps of a head other than the trace's own come from the layer's own
``MultiHeadAttention.steps`` on the recorded hidden state, and its raw q . k from the
pipeline's ``attention_scores``, exactly as ``trace_model`` makes them; nothing here
computes attention another way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

import torch

from selfattn.errors import OptionError
from selfattn.pipeline.steps import attention_scores
from selfattn.viz.explorer_data import rounded

PAGE_DATA_BUDGET = 2_800_000  # bytes of JSON; the page's script and style add about 20 kB
WEIGHT_BUDGET = 2_500_000  # bytes of weights; the rest is left for step numbers
VECTOR_PREVIEW = 16  # numbers shown of each 384-wide hidden state


@dataclass(frozen=True)
class ModelPage:
    """What a model page is made from.   L layers, H heads, n tokens, d wide."""

    model_name: str
    tokens: list[str]
    query: int
    weights: torch.Tensor  # (L, H, n, n)
    layer_inputs: list[torch.Tensor | None]  # L of (n, d): the hidden state entering each layer
    layer_outputs: list[torch.Tensor | None]  # L of (n, d): the hidden state leaving each layer
    head_weights: Callable[[int, int], torch.Tensor]  # (layer, head) -> (n, n), the weights explain prints
    head_steps: Callable[[int, int], dict[str, Any]] | None  # (layer, head) -> step numbers; None: weights only
    steps_note: str  # why a head shows no steps


def json_size(value: Any) -> int:
    """Bytes of ``value`` as the page embeds it (compact JSON, UTF-8)."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def model_page_data(
    page: ModelPage, precision: int, *, layer: int, head: int, title: str | None = None
) -> dict[str, Any]:
    """The explorer's data (``EXPLORER_DATA_DOC``) for a model page; ``layer``/``head`` selected at first."""
    n_layers, n_heads = page.weights.shape[:2]
    for name, value, count in (("layer", layer, n_layers), ("head", head, n_heads)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < count:
            raise OptionError(f"the {name} must be from 0 to {count - 1} for {page.model_name}, got {value!r}")
    weights = _weights_that_fit(page, precision, layer, head)
    steps = _steps_that_fit(page, precision, layer, head, weights)
    shown: dict[int, list[int]] = {}
    for l, h in weights:  # in order: layer by layer, head by head
        shown.setdefault(l, []).append(h)

    layers = []
    for l, heads in shown.items():
        entry: dict[str, Any] = {"name": f"layer {l}", "heads": []}
        if page.layer_outputs[l] is not None:
            entry["output"] = _preview(page.layer_outputs[l], precision)
        for h in heads:
            entry["heads"].append({"name": f"head {h}", "weights": weights[(l, h)], "steps": steps.get((l, h))})
        layers.append(entry)
    return {
        "title": title or _title(page),
        "variant": page.model_name,
        "description": _description(page, shown, steps),
        "tokens": page.tokens,
        "query": page.query,
        "precision": precision,
        "input": _preview(page.layer_inputs[layer], precision),
        "output": _preview(page.layer_outputs[layer], precision),
        "vector_width": _width(page),
        "mask": None,  # one text: no padding, so the model masks nothing
        "layers": layers,
        "selected": {"layer": list(shown).index(layer), "head": shown[layer].index(head)},
        "steps_note": page.steps_note,
    }


def _weights_that_fit(page: ModelPage, precision: int, layer: int, head: int) -> dict[tuple[int, int], list]:
    """(layer, head) -> rounded weights: every head, else the selected layer's, else the selected head's."""
    n_layers, n_heads = page.weights.shape[:2]
    selected = rounded(page.head_weights(layer, head), precision)
    per_head = json_size(selected)  # other heads round to about as many characters
    if per_head * n_layers * n_heads <= WEIGHT_BUDGET:
        keys = [(l, h) for l in range(n_layers) for h in range(n_heads)]
    elif per_head * n_heads <= WEIGHT_BUDGET:
        keys = [(layer, h) for h in range(n_heads)]
    else:
        keys = [(layer, head)]
    return {key: selected if key == (layer, head) else rounded(page.head_weights(*key), precision) for key in keys}


def _steps_that_fit(page: ModelPage, precision: int, layer: int, head: int, weights: dict) -> dict[tuple[int, int], dict]:
    """(layer, head) -> rounded steps: the selected head always; then every embedded head, or the selected layer's."""
    if page.head_steps is None:
        return {}
    steps = {(layer, head): rounded(page.head_steps(layer, head), precision)}
    room = PAGE_DATA_BUDGET - sum(json_size(w) for w in weights.values())
    per_head = json_size(steps[(layer, head)])
    same_layer = [key for key in weights if key[0] == layer]
    for group in (list(weights), same_layer):
        if per_head * len(group) <= room:
            for key in group:
                if key not in steps:
                    steps[key] = rounded(page.head_steps(*key), precision)
            break
    return steps


def _preview(vectors: torch.Tensor | None, precision: int) -> list | None:
    return None if vectors is None else rounded(vectors[:, :VECTOR_PREVIEW], precision)


def _width(page: ModelPage) -> int | None:
    known = [v for v in page.layer_outputs if v is not None]
    return int(known[0].shape[-1]) if known else None


def _title(page: ModelPage) -> str:
    shown = " ".join(page.tokens[:12]) + (" …" if len(page.tokens) > 12 else "")
    return f"selfattn · {page.model_name} · {shown}"


def _description(page: ModelPage, shown: dict[int, list[int]], steps: dict) -> str:
    n_layers, n_heads = page.weights.shape[:2]
    width = _width(page)
    parts = [
        f"{page.model_name}: a pretrained encoder with {n_layers} layers of {n_heads} heads"
        + (f", {width} wide" if width else "")
        + ", on its WordPiece tokens. One text, so no mask: every token may attend to every token."
    ]
    embedded = sum(len(h) for h in shown.values())
    if embedded < n_layers * n_heads:
        where = f"layer {next(iter(shown))}" if len(shown) == 1 and embedded > 1 else "the selected head"
        parts.append(
            f"To keep the page small it holds the weights of {where} only; choose another with --layer and --head "
            "(layer= and head= in Python)."
        )
    if steps and len(steps) < embedded:
        parts.append("Step numbers are here for " + ("the selected head" if len(steps) == 1 else "the selected layer") + ".")
    if width and width > VECTOR_PREVIEW:
        parts.append(f"Hidden states show their first {VECTOR_PREVIEW} of {width} numbers.")
    return " ".join(parts)


def trace_page(trace) -> ModelPage:
    """A ModelTrace as a model page; steps of heads other than the traced one come from the model itself."""
    from selfattn.models.loading import shared_model

    layer_steps: dict[int, Any] = {}

    def run_layer(layer: int):
        if layer not in layer_steps:
            model = shared_model(trace.model_name)
            with torch.no_grad():
                found = model.encoder.layers[layer].attention.steps(trace.hidden_states[layer][None])  # (1, n, d) in
            # The model must be the one that made the trace: its weights are the recorded ones.
            torch.testing.assert_close(found.attention.weights[0], trace.all_weights[layer], rtol=0, atol=1e-5)
            layer_steps[layer] = found
        return layer_steps[layer]

    def head_weights(layer: int, head: int) -> torch.Tensor:
        own = (layer, head) == (trace.layer, trace.head)
        return trace.weights if own else trace.all_weights[layer, head]  # (n, n)

    def head_steps(layer: int, head: int) -> dict[str, Any]:
        if (layer, head) == (trace.layer, trace.head):
            return _steps(trace.scale, trace.scores_unscaled, trace.scores, trace.scores, trace.row_max, trace.exp,
                          trace.exp_sum, trace.context)
        found = run_layer(layer)
        a = found.attention
        q, k = found.q[0, head], found.k[0, head]  # (n, d_h) each
        return _steps(a.scale, attention_scores(q, k), a.scores[0, head], a.masked_scores[0, head],
                      a.softmax.shift[0, head, :, 0], a.softmax.exp[0, head], a.softmax.total[0, head, :, 0],
                      a.output[0, head])

    n_layers = trace.n_layers
    return ModelPage(
        model_name=trace.model_name,
        tokens=list(trace.tokens),
        query=trace.query_index,
        weights=trace.all_weights,
        layer_inputs=[trace.hidden_states[l] for l in range(n_layers)],
        layer_outputs=[trace.hidden_states[l + 1] for l in range(n_layers)],
        head_weights=head_weights,
        head_steps=head_steps,
        steps_note="The step numbers of this head were left out to keep the page small; only its weights are "
        "here. Choose it with --layer and --head (layer= and head= in Python) to see every step.",
    )


def _steps(scale, raw, scaled, softmax_input, row_max, exp, exp_sum, context) -> dict[str, Any]:
    """One head's step numbers in the page's layout.   raw/scaled/exp: (n, n), row_max/exp_sum: (n,), context: (n, d_h)"""
    return {
        "score_label": "q · k",
        "scale": scale,
        "scores": raw,
        "scaled": scaled,
        # Without a mask the softmax reads the scaled scores unchanged: no column of its own.
        "softmax_input": None if torch.equal(softmax_input, scaled) else softmax_input,
        "max": row_max,
        "exp": exp,
        "exp_sum": exp_sum,
        "context": context,
    }


def output_page(output) -> ModelPage:
    """The first text of a ModelOutput (padding removed) as a model page: weights only."""
    n = len(output.tokens[0])
    weights = torch.stack([a[0, :, :n, :n] for a in output.attentions])  # (L, H, n, n): padding keys had weight 0
    n_layers = weights.shape[0]
    if output.hidden_states is not None:
        inputs = [output.hidden_states[l][0, :n] for l in range(n_layers)]
        outputs = [output.hidden_states[l + 1][0, :n] for l in range(n_layers)]
    else:
        inputs = [None] * n_layers
        outputs = [None] * (n_layers - 1) + [output.last_hidden_state[0, :n]]
    from selfattn.models.model_trace import default_model_query

    return ModelPage(
        model_name=output.model_name or "model",
        tokens=list(output.tokens[0]),
        query=default_model_query(output.tokens[0]),
        weights=weights,
        layer_inputs=inputs,
        layer_outputs=outputs,
        head_weights=lambda layer, head: weights[layer, head],
        head_steps=None,
        steps_note="A model output holds each head's weights only. For every step of one head use "
        "trace_model(text, layer=..., head=...), or selfattn view --model with --layer and --head.",
    )
