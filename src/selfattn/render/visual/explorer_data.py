"""The explorer's data: a record (the seed's, a variant's or a model's) as plain lists, ready to embed in the page.

The page never computes attention: every number it shows is here, rounded to the
precision it displays (so it prints exactly what ``explain`` prints at that precision).
The layout, one object per layer with one object per head, is documented in
``EXPLORER_DATA_DOC`` and shared with the page's JavaScript.
"""

from __future__ import annotations

from typing import Any

import torch

from selfattn.formatting import rounded
from selfattn.trace.record import AttentionTrace, record_of
from selfattn.trace.variant_names import UNSCALED
from selfattn.render.visual.model_data import (
    PAGE_DATA_BUDGET, STEP_MATRICES, VECTOR_PREVIEW, json_size, mask_entry, model_page_data, rows_note, rows_that_fit,
    trace_page,
)

EXPLORER_DATA_DOC = """
{
  "title": str, "variant": str, "description": str,
  "tokens": [str],                  shown as text, never as HTML
  "labels": [str],                  optional: how each token is shown ('␣cat' for a model's
                                    'Ġcat'); the page then gives the token in a tooltip
  "query": int,                     the token selected at first
  "precision": int,                 decimals shown; every number is rounded to it
  "input": [[num]] | null,          n x d: what attention reads (X, or X + P; a model: the
                                    selected layer's input)
  "output": [[num]] | null,         n x d_out: the final vector of every token
  "vector_width": int,              optional: the full width d when input / output (and the
                                    layers' output) hold only the first numbers of each vector
  "mask": [[bool]] | null,          n x n, true = may attend
  "layers": [{"name": str,
    "mask_ranges": [[int, int]] | null,   optional: this layer's own mask (a model: causal, its
                                    window), used instead of the top-level one: query i may see
                                    keys start..end-1 of its row; null: every key
    "mask": [[bool]] | null,        optional: the same as n x n, where a row is not one range
    "mask_label": str,              optional: what hides a key here ("hidden by the causal mask")
    "output": [[num]],              optional: this layer's output (a model's hidden state);
                                    the page shows it instead of the top-level output
    "heads": [{
      "name": str,
      "description": str,           optional: the key/value head it reads, its weight on token 0
      "kv_head": int,               optional: the key/value head this query head reads
      "first_token_share": num,     optional: mean weight of the queries after token 0 on it
      "weights": [[num]],           n x n, row = query, column = key
      "steps": null | {             the step panel's numbers (may be left out for big inputs)
          "score_label": str, "scale": num | null,
          "scores": [[num] | null], raw dot products
          "scaled": [[num] | null] | null, scores x scale
          "softmax_input": [[num | "-inf"] | null] | null,   after the mask / bias; null when
                                    nothing changed the scaled (or raw) scores
          "max": [num], "exp": [[num] | null], "exp_sum": [num],
          "context": [[num]],       this head's output for every query
          "rows": [int, int]        optional: a long input's page holds the rows of the four
                                    n x n steps above only for queries start..end-1 (the
                                    others are null), a window around the selected query
      }}]}],
  "selected": {"layer": int, "head": int},   indexes into layers and that layer's heads
  "steps_note": str,                optional: what the page says where a head has no steps
  "flash": {                        optional: the flash variant's online softmax
    "block_size": int,
    "acc_width": int,               the full width of acc; each acc below holds its first
                                    FLASH_ACC_SHOWN numbers when it is wider
    "blocks": null | [{             one per key block, in order (null when too big to embed)
        "start": int, "end": int,   the block's keys: tokens[start:end]
        "block_max": [num],         per query row: the block's largest score
        "m": [num], "rescale": [num], "l": [num],   per query row, after the block
        "acc": [[num]]}],           per query row, after the block
    "output": [[num]],              n x d_v: flash_attention's output (acc / l)
    "plain_output": [[num]],        n x d_v: the plain softmax's output
    "lse": [num],                   per query row: m + log l
    "weights_from_lse": [[num] | null],   n x n: exp(s - lse); null rows as in the steps
    "rows": [int, int]              optional: as the steps' "rows"
  }
}
A pretrained model's page (``model_data``) holds every layer's heads when they fit the
size budget, else only the selected layer or head; the names say which ones they are.
A toy page over the budget (PAGE_DATA_BUDGET, a few hundred tokens) is made to fit it, in
this order: its mask as ranges, its vectors cut to their first VECTOR_PREVIEW numbers, the
selected head only, and a window of that head's step rows around the selected query.
"""

STEP_NUMBER_BUDGET = 400_000  # step numbers embedded for every head below this; else for the selected head only
FLASH_ACC_SHOWN = 8  # components of each running acc vector in the page


def explorer_data(trace, precision: int = 4, *, title: str | None = None, head: int | None = None,
                  layer: int | None = None) -> dict[str, Any]:
    """The page's data for one record (or a view of it). ``layer`` and ``head`` are selected at first (0-based).

    A model's record (its "model" section) makes a model page, every layer within a size
    budget, its own layer and head selected unless told otherwise; the toy records (the
    seed, the variants) have one layer, read from the record's steps and sections.
    """
    record = record_of(trace)
    if record.section("model") is not None:
        chosen_layer = record.layer if layer is None else layer
        chosen_head = record.head if head is None else head
        return model_page_data(trace_page(record), precision, layer=chosen_layer, head=chosen_head, title=title)
    data = _from_toy(record)
    n_heads = len(data["layers"][0]["heads"])
    selected = 0 if head is None else head
    n = len(data["tokens"])
    if n_heads * n * n * 5 > STEP_NUMBER_BUDGET:
        for h, entry in enumerate(data["layers"][0]["heads"]):
            if h != selected:
                entry["steps"] = None
    for entry in data["layers"][0]["heads"]:
        steps = entry["steps"]
        if steps is not None:
            before = steps["scaled"] if steps["scaled"] is not None else steps["scores"]
            if torch.equal(steps["softmax_input"], before):
                steps["softmax_input"] = None  # no mask and no bias: the same numbers again
    data["title"] = title or f"selfattn · {data['variant']} · {' '.join(data['tokens'][:12])}" + (" …" if n > 12 else "")
    data["precision"] = precision
    data["selected"] = {"layer": 0, "head": selected}
    return _fit_budget(rounded(data, precision))


def _fit_budget(data: dict[str, Any]) -> dict[str, Any]:
    """A toy page within PAGE_DATA_BUDGET bytes of JSON; one that fits already is left as it is.

    What goes, in order, until it fits: the n x n mask (each row's keys as a range
    instead), the vectors' numbers past VECTOR_PREVIEW, every head but the selected one,
    and the rows of the selected head's n x n steps (and flash's weights from lse) outside
    a window of queries around the selected one.
    """
    if json_size(data) <= PAGE_DATA_BUDGET:
        return data
    layer = data["layers"][0]
    if data["mask"] is not None:
        ranges = mask_entry(torch.tensor(data["mask"]))
        if "mask_ranges" in ranges:
            layer.update(ranges)
            data["mask"] = None
    width = len(data["output"][0])
    if width > VECTOR_PREVIEW:
        data["vector_width"] = width
        for key in ("input", "output"):
            data[key] = [row[:VECTOR_PREVIEW] for row in data[key]]
    heads, chosen = layer["heads"], data["selected"]["head"]
    if len(heads) > 1 and json_size(data) > PAGE_DATA_BUDGET:
        layer["heads"] = [heads[chosen]]
        data["selected"]["head"] = 0
        data["description"] += (f" To keep the page small it holds {heads[chosen]['name']} only; choose another "
                                "with --head (head= in Python).")
    head = layer["heads"][data["selected"]["head"]]
    groups = [] if head["steps"] is None else [(head["steps"], STEP_MATRICES)]
    if "flash" in data:
        groups.append((data["flash"], ("weights_from_lse",)))
    matrices = [values[key] for values, keys in groups for key in keys if values.get(key) is not None]
    room = PAGE_DATA_BUDGET - json_size(data) + sum(json_size(m) for m in matrices)  # all but the matrices
    window = rows_that_fit(groups, data["query"], room - 300)  # room for the sentence below
    if window:
        data["description"] += " " + rows_note(window, len(data["tokens"]))
    return data


def _from_toy(record: AttentionTrace) -> dict[str, Any]:
    """The seed's or a variant's one layer: every head's weights and steps, the input, output and mask."""
    inputs, steps = record.sections["inputs"], record.layers[0]
    projected = record.section("projections") is not None
    scaled = inputs.variant not in UNSCALED
    grouped = int(steps.k.shape[0]) != steps.n_heads
    heads = []
    for h, g in enumerate(steps.kv_head_of):
        numbers = {
            "score_label": "q · k" if projected else "x_q · x_j",
            "scale": steps.scale if scaled else None,
            "scores": steps.scores[h],
            "scaled": steps.scaled[h] if scaled else None,
            "softmax_input": steps.masked[h],
            "max": steps.row_max[h],
            "exp": steps.exp[h],
            "exp_sum": steps.exp_sum[h],
            "context": steps.context[h],
        }
        heads.append({"name": f"head {h}" + (f" (kv {g})" if grouped else ""), "weights": steps.weights[h], "steps": numbers})
    data = {
        "variant": inputs.variant,
        "description": _description(record),
        "tokens": record.tokens,
        "query": record.query.index,
        "input": steps.input,
        "output": steps.output,
        "mask": steps.allowed,
        "layers": [{"name": "layer 0", "heads": heads}],
    }
    flash = record.section("flash")
    if flash is not None:
        data["flash"] = _flash(record, flash)
    return data


def _description(record: AttentionTrace) -> str:
    """One line on what ran: the seed's own attention, or the variant and what its sections add."""
    if record.section("seed") is not None:
        return "The seed's self-attention: softmax(X Xᵀ) X, no projections and no scaling."
    inputs, steps = record.sections["inputs"], record.layers[0]
    extras = []
    positional = record.sections["positional"].name
    if positional != "none":
        extras.append(f"positional encoding: {positional}")
    if record.section("projections") is not None:
        extras.append(f"untrained projections, seed {inputs.seed}")
    if record.sections["variant"].keeps_heads_axis:
        extras.append(f"{steps.n_heads} query heads, {int(steps.k.shape[0])} key/value heads, d_k = {int(steps.q.shape[-1])}")
    flash = record.section("flash")
    if flash is not None:
        extras.append(f"the seed's unscaled scores, keys folded in {flash.block_size} at a time by the online softmax")
    return f"Variant '{inputs.variant}'" + (f" ({'; '.join(extras)})" if extras else "") + "."


def _flash(record: AttentionTrace, f) -> dict[str, Any]:
    """The running numbers after every key block, for every query row (see EXPLORER_DATA_DOC)."""
    n, width = len(record.tokens), f.output.shape[-1]
    shown = min(width, FLASH_ACC_SHOWN)
    blocks = [
        {
            "start": b.start,
            "end": b.end,
            "block_max": b.block_max,
            "m": b.m_after,
            "rescale": b.rescale,
            "l": b.l_after,
            "acc": b.acc_after[:, :shown],
        }
        for b in f.blocks
    ]
    if len(blocks) * n * (4 + shown) > STEP_NUMBER_BUDGET:
        blocks = None
    return {
        "block_size": f.block_size,
        "acc_width": width,
        "blocks": blocks,
        "output": f.output,
        "plain_output": f.plain_output,
        "lse": f.lse,
        "weights_from_lse": f.weights_from_lse,
    }
