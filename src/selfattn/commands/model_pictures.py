"""What a pretrained model's position pictures draw, read from the loaded model itself.

    positional_picture(model, ...)   a learned table (BERT, GPT-2), or RoPE's turn of q and k
    rope_grid(trace, model, n)       one (q, k) pair of the traced head scored at every pair of positions

Both need the model's own settings (its position table, its RoPE's base, scaling and
pairing), so they live with the commands, which load it; ``viz.plots`` draws the results.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from selfattn.errors import OptionError
from selfattn.pipeline.steps import attention_scores
from selfattn.positional import apply_rope
from selfattn.trace.model_trace import check_layer_head
from selfattn.trace.variant_names import distance_check_key
from selfattn.render.visual.model_labels import trace_labels

POSITIONS_SHOWN = 64  # rows of a position picture (fewer when the model has fewer positions)
FEATURES_SHOWN = 64  # columns of a learned table's picture


class PositionPicture(NamedTuple):
    """What ``plot --kind positional --model`` draws: a (positions, features) table, its title and scale."""

    table: torch.Tensor  # (positions, features)
    title: str
    limit: float | None  # the colour scale's half-span; None: the plot's default
    xlabel: str


def positional_picture(model, layer: int, head: int) -> PositionPicture:
    """How positions enter the model: its learned table, or RoPE's rotation in ``layer``'s attention.

    A learned table (``AttentionInfo.positional == "learned"``) is drawn from the model's
    own embedding step: its position part for positions 0 .. 63, first 64 features. A RoPE
    model has no table: positions turn q and k inside attention, so the picture is the
    layer's own RoPE (its base, its scaling of the frequencies, its pairing of features)
    applied to a vector whose every pair starts at (1, 0): at position p pair i reads
    (cos p theta_i, sin p theta_i).
    """
    info = model.attention_info(0)
    check_layer_head(layer, head, len(model.blocks), info.n_heads)
    info = model.attention_info(layer)
    limit = getattr(model.tokenizer, "max_length", None)
    positions = min(POSITIONS_SHOWN, limit or POSITIONS_SHOWN)
    if info.positional == "learned":
        with torch.no_grad():
            part = model.embedding_step(torch.zeros(1, positions, dtype=torch.long)).part("position")
        if part is None:
            raise OptionError(f"{model.name} adds no position vectors to its tokens: there is no table to draw")
        d = part.vectors.shape[1]
        table = part.vectors[:, :FEATURES_SHOWN]  # (positions, 64) of the table's (max positions, d)
        of = f" of {limit}" if limit else ""
        title = (f"{model.name}: learned position embeddings, positions 0-{positions - 1}{of}, "
                 f"features 0-{table.shape[1] - 1} of {d}")
        # Learned values are small (about 0.1): the scale spans what the picture holds.
        return PositionPicture(table, title, float(table.abs().max()) or 1.0, "dimension")
    a = model.blocks[layer].config.attention
    d_head = a.d_head or a.d_model // a.n_heads
    unit = torch.zeros(positions, d_head)
    half = a.rope_pairs == "half"
    if half:
        unit[:, : d_head // 2] = 1.0  # pair i is (i, i + d_head/2): its first member starts at 1
    else:
        unit[:, 0::2] = 1.0  # pair i is (2i, 2i + 1)
    table = apply_rope(unit, torch.arange(positions), a.rope_base, pairs=a.rope_pairs, scaling=a.rope_scaling)
    pairing = (f"features i and i + {d_head // 2} pair up: cos left, sin right" if half
               else "features 2i and 2i + 1 pair up: cos, sin side by side")
    scaled = f", {info.rope_scaling.split(':')[0]}-rescaled" if info.rope_scaling else ""
    title = (f"{model.name} has no position table: RoPE turns each head's q and k by position inside attention. "
             f"Layer {layer}'s RoPE on (1, 0) pairs: at position p pair i reads (cos pθ_i, sin pθ_i), "
             f"θ_i = {a.rope_base:g}^(-2i/{d_head}){scaled}; {pairing}")
    return PositionPicture(table, title, 1.0, "feature of q or k")


class RopeGrid(NamedTuple):
    """What ``plot --kind rope-distance --model`` draws: one pair's RoPE score at every pair of positions."""

    grid: torch.Tensor  # (n, n): (R(i) q) . (R(j) k)
    title: str
    panel_title: str


def rope_grid(trace, model, n_positions: int) -> RopeGrid:
    """The traced head's query and one other token's key, before RoPE, turned to every pair of positions.

    q is the head's ``q_plain`` at the query, k is ``k_plain`` at the first other token
    (the key/value head the query head reads); both are turned by the layer's own RoPE
    (base, scaling, pairing) to positions 0 .. n-1, and every turned pair is scored with the
    pipeline's ``attention_scores``. A score that depends only on i - j is the same along
    every diagonal.
    """
    steps, m = trace.steps, trace.sections["model"]
    kv_head = steps.kv_head_of[trace.head]
    if steps.q_plain is None:
        raise OptionError(
            f"--kind rope-distance turns q and k with RoPE, and {m.model_name} has no RoPE: its positions are a "
            "learned table added to the embeddings (draw it with --kind positional)"
        )
    a = model.blocks[trace.layer].config.attention
    labels = trace_labels(trace)
    qi = trace.query.index
    ki = distance_check_key(qi, len(trace.tokens))
    positions = torch.arange(n_positions)
    rope = {"base": a.rope_base, "pairs": a.rope_pairs, "scaling": a.rope_scaling}
    with torch.no_grad():
        q_at = apply_rope(steps.q_plain[trace.head, qi].expand(n_positions, -1), positions, **rope)  # (n, d_head): q at i
        k_at = apply_rope(steps.k_plain[kv_head, ki].expand(n_positions, -1), positions, **rope)  # (n, d_head): k at j
        grid = attention_scores(q_at, k_at)  # (n, n): (R(i) q) . (R(j) k)
    info = m.infos[trace.layer]
    kv = f", key/value head {kv_head}" if info.n_kv_heads != info.n_heads else ""
    title = (f"{m.model_name}, layer {trace.layer}, head {trace.head}{kv}: the query '{labels[qi]}' and the key "
             f"'{labels[ki]}' before RoPE, placed at every pair of positions 0-{n_positions - 1}")
    panel = (f"q·k after the model's RoPE turns q to position i and k to position j (base {a.rope_base:g}): "
             "the same along every diagonal (i - j fixed)")
    return RopeGrid(grid, title, panel)
