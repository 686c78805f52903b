"""The explorer's data for a pretrained model: every layer's and head's weights, within a size budget.

A model page carries far more numbers than a toy one: all-MiniLM-L6-v2 has 6 layers of
12 heads, each an n x n matrix. What goes in, largest first while it fits:
  weights   every layer's heads; else the selected layer's heads; else the selected head.
  steps     (scores, scaled scores, exp, context) the selected head always, whole when it
            fits, else its n x n rows for a window of queries around the selected one
            (``rows_that_fit``); then every embedded head if they all fit, else the
            selected layer's heads if they fit.
  vectors   each layer's output hidden state, first VECTOR_PREVIEW of its d numbers.
Sizes are measured as the page's JSON: the selected head's numbers exactly, the rest
estimated from it, so a 64-token sentence with all 6 x 12 heads stays under 3 MB, and a
512-token one (one head's weights, a window of its step rows) about as much.

Every head's steps come from the trace, which keeps each block's own ``attention_steps``
and every head's raw q . k; nothing here computes attention or loads the model. Every family reads the same records: each layer's mask (causal,
a sliding window) from its block, the key/value head each query head reads, each head's
share of weight on the first token, and the tokens as they read beside the vocabulary's
own spelling.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

import torch

from selfattn.errors import OptionError
from selfattn.models.description import AttentionInfo
from selfattn.formatting import rounded
from selfattn.render.visual.model_labels import hidden_label
from selfattn.render.visual.token_labels import token_labels
from selfattn.trace.record import AttentionTrace

PAGE_DATA_BUDGET = 2_800_000  # bytes of JSON; the page's script and style add about 20 kB
WEIGHT_BUDGET = 2_500_000  # bytes of weights; the rest is left for step numbers
VECTOR_PREVIEW = 16  # numbers shown of each 384-wide hidden state
STEP_MATRICES = ("scores", "scaled", "softmax_input", "exp")  # a head's (n, n) steps: one row per query


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
    head_steps: Callable[[int, int], dict[str, Any] | None] | None  # (layer, head) -> step numbers (None: not known);
    # None: weights only
    steps_note: str  # why a head shows no steps
    labels: list[str] | None = None  # each token as it reads ('␣cat'); None: as written
    masks: dict[int, torch.Tensor | None] | None = None  # layer -> (n, n) bool, True = may attend, None: every key;
    # a layer left out: its mask is not known (nothing is marked); None: no layer's is known
    attention: tuple[AttentionInfo, ...] | None = None  # each layer's attention; None: not known
    note: str = ""  # a last sentence for the description


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
    previews = [_preview(v, precision) for v in page.layer_outputs] + [_preview(page.layer_inputs[layer], precision)]
    steps = _steps_that_fit(page, precision, layer, head, weights, sum(json_size(p) for p in previews))
    shown: dict[int, list[int]] = {}
    for l, h in weights:  # in order: layer by layer, head by head
        shown.setdefault(l, []).append(h)

    layers = []
    for l, heads in shown.items():
        entry: dict[str, Any] = {"name": f"layer {l}", "heads": []}
        if page.layer_outputs[l] is not None:
            entry["output"] = _preview(page.layer_outputs[l], precision)
        if page.masks is not None:
            entry.update(mask_entry(page.masks.get(l)))
            if page.attention is not None:
                entry["mask_label"] = hidden_label(page.attention[l])
        for h in heads:
            entry["heads"].append(_head_entry(page, l, h, weights[(l, h)], steps.get((l, h)), precision))
        layers.append(entry)
    data = {
        "title": title or _title(page),
        "variant": page.model_name,
        "description": _description(page, shown, steps),
        "tokens": page.tokens,
        "query": page.query,
        "precision": precision,
        "input": _preview(page.layer_inputs[layer], precision),
        "output": _preview(page.layer_outputs[layer], precision),
        "vector_width": _width(page),
        # One text has no padding: only a causal model (or a window) hides keys, and each layer
        # carries its own mask (as ranges of keys: n x n booleans would not fit a long page).
        "mask": None,
        "layers": layers,
        "selected": {"layer": list(shown).index(layer), "head": shown[layer].index(head)},
        "steps_note": page.steps_note,
    }
    if page.labels is not None and page.labels != page.tokens:
        data["labels"] = page.labels
    return data


def rows_that_fit(groups: list[tuple[dict, tuple[str, ...]]], query: int, room: int) -> list[int] | None:
    """Null the rows of (n, n) matrices outside a window of queries around ``query``, so that they fit ``room`` bytes.

    Each group is a dict and the keys of its (n, n) matrices (rounded lists; a None value
    is skipped); one window [start, end) serves them all, as wide as ``room`` allows (at
    least the query's own row), and each dict gets "rows": [start, end]. Nothing changes
    when every row fits.

    Returns:
        [start, end), or None when every row fits.
    """
    matrices = [(values, key) for values, keys in groups for key in keys if values.get(key) is not None]
    if not matrices or sum(json_size(values[key]) for values, key in matrices) <= room:
        return None
    n = len(matrices[0][0][matrices[0][1]])
    per_row = sum(json_size(values[key][query]) + 1 for values, key in matrices)  # a row and its comma
    nulls = len(matrices) * (n * 5 + 2)  # "null," for every row left out
    count = max(1, min(n, (room - nulls) // max(1, per_row)))
    start = max(0, min(query - count // 2, n - count))
    for values, key in matrices:
        values[key] = [row if start <= i < start + count else None for i, row in enumerate(values[key])]
    for values, _ in groups:
        values["rows"] = [start, start + count]
    return [start, start + count]


def rows_note(window: list[int], n: int) -> str:
    """The description's sentence on a window of step rows."""
    return (f"The selected head's scores, scaled scores and exps are here for queries {window[0]} to {window[1] - 1} of {n}, around the "
            "selected one (--query picks another); the weights are here for every query.")


def mask_entry(allowed: torch.Tensor | None) -> dict[str, Any]:
    """A layer's mask for the page: each query's visible keys as [start, end), or the full (n, n) where not a range."""
    if allowed is None:
        return {"mask_ranges": None}
    n = allowed.shape[0]
    ranges = []
    for row in allowed:  # (n,) bool
        seen = torch.nonzero(row).flatten()
        start, end = (int(seen[0]), int(seen[-1]) + 1) if len(seen) else (0, 0)
        if int(row.sum()) != end - start:  # a gap: not one range (no model makes this on one text)
            return {"mask": allowed.tolist()}
        ranges.append([start, end])
    return {"mask_ranges": None if ranges == [[0, n]] * n else ranges}


def first_token_share(weights: torch.Tensor) -> float | None:
    """A head's mean weight on token 0 over the queries after it (the "attention sink").   (n, n) -> float"""
    return float(weights[1:, 0].mean()) if weights.shape[0] > 1 else None


def _head_entry(page: ModelPage, layer: int, head: int, weights: list, steps, precision: int) -> dict[str, Any]:
    """One head of the page: its name (with the key/value head it reads), weights, steps and first-token share."""
    name, notes = f"head {head}", []
    if page.attention is not None:
        info = page.attention[layer]
        if info.n_kv_heads != info.n_heads:
            kv, group = info.kv_head(head), info.group_size
            name += f" (kv {kv})"
            first = kv * group
            kind = "multi-query attention" if info.n_kv_heads == 1 else "grouped-query attention"
            notes.append(
                f"Query head {head} reads key/value head {kv}, which query heads {first}-{first + group - 1} share "
                f"({kind}: {info.n_heads} query heads, {info.n_kv_heads} key/value head{'s' if info.n_kv_heads > 1 else ''})."
            )
    entry: dict[str, Any] = {"name": name, "weights": weights, "steps": steps}
    if page.attention is not None:
        entry["kv_head"] = page.attention[layer].kv_head(head)
    share = first_token_share(page.head_weights(layer, head))
    if share is not None:
        entry["first_token_share"] = round(share, precision)
        first = (page.labels or page.tokens)[0]
        notes.append(
            f"The queries after token 0 ('{first}') put on average {100 * share:.0f}% of their weight on it"
            + (" (an attention sink: a place to put weight that is needed nowhere else)." if share >= 0.5 else ".")
        )
    if notes:
        entry["description"] = " ".join(notes)
    return entry


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


def _steps_that_fit(page: ModelPage, precision: int, layer: int, head: int, weights: dict,
                    reserved: int = 0) -> dict[tuple[int, int], dict]:
    """(layer, head) -> rounded steps: the selected head always (a window of its rows when it is too big);
    then every embedded head, or the selected layer's. ``reserved``: bytes the page's vectors take."""
    if page.head_steps is None:
        return {}
    selected = page.head_steps(layer, head)
    if selected is None:  # the page's model could not give them
        return {}
    steps = {(layer, head): rounded(selected, precision)}
    room = PAGE_DATA_BUDGET - reserved - sum(json_size(w) for w in weights.values())
    if rows_that_fit([(steps[(layer, head)], STEP_MATRICES)], page.query, room) is not None:
        return steps  # not even this head's every row fits: no other head's steps
    per_head = json_size(steps[(layer, head)])
    same_layer = [key for key in weights if key[0] == layer]
    for group in (list(weights), same_layer):
        if per_head * len(group) <= room:
            for key in group:
                found = None if key in steps else page.head_steps(*key)
                if found is not None:  # None: the page's model could not give them
                    steps[key] = rounded(found, precision)
            break
    return steps


def _preview(vectors: torch.Tensor | None, precision: int) -> list | None:
    return None if vectors is None else rounded(vectors[:, :VECTOR_PREVIEW], precision)


def _width(page: ModelPage) -> int | None:
    known = [v for v in page.layer_outputs if v is not None]
    return int(known[0].shape[-1]) if known else None


def _title(page: ModelPage) -> str:
    tokens = page.labels or page.tokens
    shown = " ".join(tokens[:12]) + (" …" if len(tokens) > 12 else "")
    return f"selfattn · {page.model_name} · {shown}"


def _architecture(page: ModelPage) -> str:
    """The first sentences of the description, from the layers' records."""
    n_layers, n_heads = page.weights.shape[:2]
    width = _width(page)
    wide = f", {width} wide" if width else ""
    if page.attention is None:
        return f"{page.model_name}: a pretrained model with {n_layers} layers of {n_heads} heads{wide}, on its own tokens."
    info = page.attention[0]
    heads = f"{n_heads} heads"
    if info.n_kv_heads != info.n_heads:
        heads = f"{n_heads} query heads sharing {info.n_kv_heads} key/value head{'s' if info.n_kv_heads > 1 else ''}"
    kind = "decoder" if info.causal else "encoder"
    parts = [f"{page.model_name}: a pretrained {kind} with {n_layers} layers of {heads}{wide}, on its own tokens."]
    windows = sorted({(i.window, l) for l, i in enumerate(page.attention) if i.window})
    if info.causal:
        parts.append("It is causal: each token sees only itself and the tokens before it; greyed keys are hidden "
                     "by the causal mask and get no weight.")
        if windows:
            layers = ", ".join(str(l) for _, l in windows)
            parts.append(f"Layer{'s' if len(windows) > 1 else ''} {layers} also hide{'' if len(windows) > 1 else 's'} "
                         f"keys outside a sliding window of the {windows[0][0]} newest.")
    else:
        parts.append("One text, so no mask: every token may attend to every token.")
    if info.positional == "rope":
        parts.append(f"Positions enter through RoPE: each head's q and k are turned by the token's position "
                     f"(base {info.rope_base:g}) before q · k, so the scores shown are of the turned vectors.")
    else:
        parts.append("Positions enter as a learned vector added to each token's embedding.")
    if page.labels is not None and page.labels != page.tokens:
        parts.append("Tokens are shown as they read (␣ marks a leading space); hover one for the vocabulary's own "
                     "spelling.")
    return " ".join(parts)


def _description(page: ModelPage, shown: dict[int, list[int]], steps: dict) -> str:
    n_layers, n_heads = page.weights.shape[:2]
    width = _width(page)
    parts = [_architecture(page)]
    embedded = sum(len(h) for h in shown.values())
    if embedded < n_layers * n_heads:
        where = f"layer {next(iter(shown))}" if len(shown) == 1 and embedded > 1 else "the selected head"
        parts.append(
            f"To keep the page small it holds the weights of {where} only; choose another with --layer and --head "
            "(layer= and head= in Python)."
        )
    if steps and len(steps) < embedded:
        parts.append("Step numbers are here for " + ("the selected head" if len(steps) == 1 else "the selected layer") + ".")
    window = next((s["rows"] for s in steps.values() if "rows" in s), None)
    if window:
        parts.append(rows_note(window, len(page.tokens)))
    if width and width > VECTOR_PREVIEW:
        parts.append(f"Hidden states show their first {VECTOR_PREVIEW} of {width} numbers.")
    if page.note:
        parts.append(page.note)
    return " ".join(parts)


def trace_page(t: AttentionTrace) -> ModelPage:
    """A model's record as a model page: every head's weights and steps, as each layer's own steps recorded them."""
    m = t.sections["model"]
    weights = t.all_weights  # (layers, heads, n, n), rebuilt once: a long text's layers come from lse

    def head_weights(layer: int, head: int) -> torch.Tensor:
        own = (layer, head) == (t.layer, t.head)
        return t.steps.weights[t.head] if own else weights[layer, head]  # (n, n)

    def head_steps(layer: int, head: int) -> dict[str, Any] | None:
        # Every head from its block's own steps, the traced one too: the same numbers the
        # record's own head has, with the scaled scores before the mask beside those after it.
        s = t.layers[layer]
        return _steps(s.scale, s.scores[head], s.scaled[head], s.masked[head], s.row_max[head], s.exp[head],
                      s.exp_sum[head], s.context[head])

    n_layers = t.n_layers
    return ModelPage(
        model_name=m.model_name,
        tokens=list(t.tokens),
        query=t.query.index,
        weights=weights,
        layer_inputs=[m.hidden_states[l] for l in range(n_layers)],
        layer_outputs=[m.hidden_states[l + 1] for l in range(n_layers)],
        head_weights=head_weights,
        head_steps=head_steps,
        steps_note="The step numbers of this head were left out to keep the page small; only its weights are "
        "here. Choose it with --layer and --head (layer= and head= in Python) to see every step.",
        labels=token_labels(list(t.tokens), list(m.readable)),
        masks=dict(enumerate(t.masks)),  # every layer's: the record keeps each one's mask (None: every key)
        attention=tuple(m.infos),
    )


def _steps(scale, raw, scaled, softmax_input, row_max, exp, exp_sum, context) -> dict[str, Any]:
    """One head's step numbers in the page's layout.   raw/scaled/exp: (n, n), row_max/exp_sum: (n,), context: (n, d_head)"""
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
    real = output.attention_mask[0].bool()  # (seq,): the first text's tokens, wherever its padding is
    weights = torch.stack([a[0][:, real][:, :, real] for a in output.attentions])  # (L, H, n, n): padding keys had weight 0
    n_layers = weights.shape[0]
    if output.hidden_states is not None:
        inputs = [output.hidden_states[l][0, real] for l in range(n_layers)]
        outputs = [output.hidden_states[l + 1][0, real] for l in range(n_layers)]
    else:
        inputs = [None] * n_layers
        outputs = [None] * (n_layers - 1) + [output.last_hidden_state[0, real]]
    # A decoder's output (it has logits) is causal: later keys are hidden. Its windows are not
    # recorded in the output, so a windowed layer shows only the causal part.
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    masks = {layer: causal for layer in range(n_layers)} if output.logits is not None else None
    from selfattn.models.queries import default_model_query

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
        masks=masks,
    )
