"""`selfattn plot` and `selfattn view`: from a configuration to a picture or a page on disk.

Every check that can fail (the output path, the kind, the layer and head, the mask
spec) runs before any file is touched; files are written atomically.

With a pretrained model (--model, any family) the pictures show the chosen layer and head
with the model's tokens as they read ('␣cat' for 'Ġcat'); ``heads`` draws every layer
(rows) and head (columns); keys a mask hides (a decoder's later tokens, outside a sliding
window) are grey. ``mask`` draws the model's own mask for one text (a --mask spec over
its tokens instead; with --length, ``block_map_command`` draws a mask's block map at
that length, ``commands.block_map``); ``positional`` draws its learned position table, or
for a RoPE model the layer's own rotation of q and k (``commands.model_pictures``). ``rope-distance`` places the query's vector and one
other token's at every pair of positions, once turned by RoPE and once with the
sinusoidal table added to X; with a RoPE model, the traced head's q and k turned by the
model's own RoPE. The page holds every layer and head that fits its budget.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import torch

from selfattn.commands.model_pictures import positional_picture, rope_grid
from selfattn.commands.explain_options import ExplainConfig
from selfattn.commands.plot_options import (
    check_plot_options,
    check_positional_picture,
    check_shown_head,
    check_view_options,
    positional_picture_name,
    rope_distance_config,
)
from selfattn.commands.traces import build_trace
from selfattn.errors import OptionError
from selfattn.models.loading import shared_model
from selfattn.masks import causal_bottom_right, causal_top_left, document_mask, padding_mask, sliding_window_mask
from selfattn.positional import apply_rope, rope_angles, sinusoidal_encoding
from selfattn.positional.rope import rope_score_grid
from selfattn.positional.sinusoidal import sinusoidal_score_grid
from selfattn.trace.variant_names import PROJECTED, distance_check_key
from selfattn.render.visual import model_labels
from selfattn.render.visual.explorer import explorer_html
from selfattn.render.visual.mask_specs import check_spec, document_lengths, prefix_lm_mask
from selfattn.render.visual.output_files import write_text

POSITIONAL_PICTURE = {"positions": 64, "width": 64}  # an encoding is drawn for 64 positions x 64 features
ROPE_TURN_POSITIONS = 8  # the RoPE picture turns each pair to positions 0-7
ROPE_DISTANCE_POSITIONS = 16  # rope-distance: positions 0-15 on each axis, or the sentence's length if longer


def source_name(trace) -> str:
    """What made the weights: the model, or the attention variant."""
    model = trace.section("model")
    return model.model_name if model is not None else trace.sections["inputs"].variant


def is_model(trace) -> bool:
    """Whether the record has a model's section: its pictures grey what the model's masks hide."""
    return trace.section("model") is not None


def plot(
    config: ExplainConfig,
    kind: str,
    output: str,
    *,
    layer: int = 0,
    head: int = 0,
    mask: str | None = None,
    dim: int | None = None,
    tile: int | None = None,
    fixed_scale: bool = False,
) -> Path:
    """Draw ``kind`` for the configured input and save it as PNG or SVG.

    A heatmap's colours span its own smallest to largest weight; ``fixed_scale`` spans 0 to 1.
    """
    from selfattn.render.visual import plots, positional_plots  # matplotlib: only the pictures need it, not view's page

    target = check_plot_options(config, kind, output, layer=layer, head=head, mask=mask, dim=dim, tile=tile,
                                fixed_scale=fixed_scale)
    if kind == "positional":
        if config.model is not None:
            picture = positional_picture(shared_model(config.model, config.model_key), layer, head)
            figure = positional_plots.positional_figure(picture.table, title=picture.title, limit=picture.limit,
                                             xlabel=picture.xlabel)
        else:
            figure = _positional_figure(config, dim)
        return plots.save_figure(figure, target)
    if kind == "rope-distance":
        if config.model is not None:
            trace = build_trace(config)
            grid = rope_grid(trace, shared_model(config.model, config.model_key), max(ROPE_DISTANCE_POSITIONS, len(trace.tokens)))
            figure = positional_plots.score_grids_figure([grid.grid], [grid.panel_title], title=grid.title)
            return plots.save_figure(figure, target)
        picture = rope_distance_picture(config, layer, head)
        figure = positional_plots.score_grids_figure([picture.rope, picture.sinusoidal], picture.titles, title=picture.title)
        return plots.save_figure(figure, target)

    trace = build_trace(config)
    check_shown_head(layer, head, trace.n_layers, trace.n_heads)
    weights = trace.all_weights  # (layers, heads, n, n)
    tokens = model_labels.trace_labels(trace)
    name = source_name(trace)
    hidden, label = _hidden(trace, config, kind, layer)  # (layers, n, n) bool or None: what a mask hides
    if is_model(trace):
        where = f"{name}, layer {layer}, head {head}"
    else:
        where = f"layer {layer}, head {head}" if weights.shape[1] > 1 else name
    if kind == "heatmap":
        figure = plots.heatmap_figure(weights[layer, head], tokens, tokens, title=f"Attention weights ({where})",
                                      hidden=None if hidden is None else hidden[layer], hidden_label=label,
                                      fixed_scale=fixed_scale)
    elif kind == "arrows":
        q = trace.query.index
        figure = plots.arrows_figure(tokens, weights[layer, head, q], q, title=f"Where '{tokens[q]}' looks ({where})",
                                     hidden=None if hidden is None else hidden[layer, q], hidden_label=label)
    elif kind == "heads":
        names = [f"head {h}" for h in range(weights.shape[1])]
        if is_model(trace):
            n_layers, n_heads = weights.shape[:2]
            title = f"Attention weights of every head ({name}: {n_layers} layers × {n_heads} heads, one row per layer)"
        else:
            title = f"Attention weights of every head ({name})"
        figure = plots.heads_figure(weights, tokens, head_names=names, title=title, hidden=hidden, hidden_label=label)
    else:
        allowed, rows, columns, title = mask_picture(mask, trace)
        label = "masked" if mask is not None or not is_model(trace) else label
        figure = plots.mask_figure(allowed, rows, columns, title=title, block_size=tile or default_tile(len(columns)),
                                   hidden_label=label)
    return plots.save_figure(figure, target)


def _hidden(trace, config: ExplainConfig, kind: str, layer: int) -> tuple[torch.Tensor | None, str]:
    """(layers, n, n) bool, True where a model's mask hides a key (None: nothing hidden), and the legend's words.

    Only a model's pictures grey hidden cells; the toy variants keep their own pictures.
    """
    if not is_model(trace) or kind == "mask":
        infos = [_layer_info(trace)] if is_model(trace) else []
        return None, model_labels.hidden_label(infos) if infos else "masked"
    if kind == "heads":
        masks = model_labels.model_masks(trace)
        label = model_labels.hidden_label(list(trace.sections["model"].infos))
    else:
        masks = tuple(trace.steps.allowed if l == layer else None for l in range(trace.n_layers))
        label = model_labels.hidden_label(_layer_info(trace))
    if all(m is None for m in masks):
        return None, label
    n = len(trace.tokens)
    everyone = torch.ones(n, n, dtype=torch.bool)
    return ~torch.stack([everyone if m is None else m for m in masks]), label  # (layers, n, n)


def view(config: ExplainConfig, output: str, *, layer: int = 0, head: int = 0) -> Path:
    """Write the interactive explorer for the configured input as one HTML file."""
    target = check_view_options(config, output, layer=layer, head=head)
    trace = build_trace(config)
    check_shown_head(layer, head, trace.n_layers, trace.n_heads)
    return write_text(target, explorer_html(trace, config.precision, head=head, layer=layer))


def mask_picture(spec: str | None, trace) -> tuple[torch.Tensor, list[str], list[str], str]:
    """(mask (q_len, kv_len), query labels, key labels, title) for a --mask spec, or the variant's own mask."""
    tokens = model_labels.trace_labels(trace)
    n = len(tokens)
    if spec is None:
        own = None if is_model(trace) else trace.layers[0].allowed
        if own is not None:
            return own, tokens, tokens, "Causal mask (top-left): no token sees a later one"
        everyone = torch.ones(n, n, dtype=torch.bool)
        if is_model(trace):
            allowed = trace.steps.allowed
            return (everyone if allowed is None else allowed), tokens, tokens, _model_mask_title(trace)
        return everyone, tokens, tokens, "No mask: every token may attend to every token"
    name, value, argument = check_spec(spec, n)
    if name == "none":
        return torch.ones(n, n, dtype=torch.bool), tokens, tokens, "No mask"
    if name == "causal":
        return causal_top_left(n), tokens, tokens, "Causal mask, aligned top-left (torch's is_causal)"
    if name == "causal-bottom-right":
        past = 3 if value is None else value
        keys = [f"cached {i}" for i in range(past)] + tokens  # counted from 0, as positions are
        title = f"Causal mask, aligned bottom-right: {past} cached keys before the sentence"
        return causal_bottom_right(n, n + past), tokens, keys, title
    if name == "sliding-window":
        window = 3 if value is None else value
        return sliding_window_mask(n, left=window - 1), tokens, tokens, f"Causal sliding window of {window} tokens"
    if name == "documents":
        lengths = document_lengths(spec, argument, n)
        title = f"Packed documents of {', '.join(map(str, lengths))} tokens: each token sees only its own document"
        return document_mask(lengths), tokens, tokens, title
    if name == "padding":
        length = max(n - 2, 1) if value is None else value
        keys = tokens[:length] + [f"[pad] {t}" for t in tokens[length:]]
        allowed = padding_mask([length], n)[0, 0].expand(n, n)  # (1, 1, 1, n) -> (n, n)
        return allowed, tokens, keys, f"Padding mask: keys after the first {length} are padding"
    prefix = n // 2 if value is None else value  # prefix-lm, the one name left
    title = f"Prefix-LM: the first {prefix} tokens see each other both ways, the rest causally"
    return prefix_lm_mask(n, prefix).dense()[0, 0], tokens, tokens, title  # (1, 1, n, n) -> (n, n)


def _model_mask_title(trace) -> str:
    """What the model's own mask on one text is, from the traced layer's records."""
    name, info = source_name(trace), _layer_info(trace)
    if trace.steps.allowed is None:
        # An encoder masks only padding keys, and one text has none.
        return f"No mask: on one text {name} lets every token attend to every token"
    title = f"{name}'s mask in layer {trace.layer}: causal, each token sees itself and the tokens before it"
    if info.window:
        title += f", at most its {info.window} newest (a sliding window)"
    return title


def _layer_info(trace):
    """The traced layer's ``AttentionInfo`` (a model's record)."""
    return trace.sections["model"].infos[trace.layer]


class RopeDistancePicture(NamedTuple):
    """What ``plot --kind rope-distance`` draws: two (n, n) grids of one (q, k) pair's score.

    Attributes:
        rope: (n, n), (R(i) q) . (R(j) k): constant along each diagonal.
        sinusoidal: (n, n), ((x_q + P_i) W_q) . ((x_k + P_j) W_k): not constant.
        titles: one title per grid.
        title: what the grids share: the tokens, the positions, the width used.
    """

    rope: torch.Tensor  # (n, n)
    sinusoidal: torch.Tensor  # (n, n)
    titles: list[str]
    title: str


def rope_distance_picture(config: ExplainConfig, layer: int = 0, head: int = 0) -> RopeDistancePicture:
    """The query's vector and the first other token's, at every pair of positions 0 .. n-1.

    n is ROPE_DISTANCE_POSITIONS (16) or the sentence's length if longer. With
    projections (qkv, causal, multihead, gqa) the vectors are head ``head``'s q and its
    key head's k before RoPE (the trace is built with RoPE, so d_k is even), and the
    sinusoidal grid adds P to X before W_q and W_k. Without them the vectors are the
    embeddings themselves, the same vectors in both grids; with an odd width RoPE turns
    the leading pairs and keeps the last feature, as ``explain --positional rope`` does.

    Args:
        config: the sentence, embeddings, variant and query; ``positional`` must be
            "none", "rope" or "sinusoidal" (both are drawn whichever it is).
        layer: must be 0: the variants have one layer.
        head: the query head whose q is used (its key head gives k); default 0.

    Returns:
        The two grids from ``rope_score_grid`` and ``sinusoidal_score_grid`` with their titles.

    Raises:
        OptionError: a pretrained model, another positional encoding, fewer than 2
            features, an odd --d-k, or a layer or head out of range.
    """
    projected = config.variant in PROJECTED
    trace = build_trace(rope_distance_config(config))
    check_shown_head(layer, head, trace.n_layers, trace.n_heads)
    tokens, qi = trace.tokens, trace.query.index
    ki = distance_check_key(qi, len(tokens))
    n = max(ROPE_DISTANCE_POSITIONS, len(tokens))
    where = source_name(trace) + (f", head {head}" if trace.n_heads > 1 else "")
    pair = f"'{tokens[qi]}' (query) and '{tokens[ki]}' (key)"
    if projected:
        steps, weights_in = trace.steps, trace.sections["projections"]
        d_k, g = int(steps.q.shape[-1]), steps.kv_head_of[head]
        q_plain = steps.q if steps.q_plain is None else steps.q_plain  # before RoPE
        k_plain = steps.k if steps.k_plain is None else steps.k_plain
        q, k = q_plain[head, qi], k_plain[g, ki]  # (d_k,) each
        w_q = weights_in.w_q[:, head * d_k:(head + 1) * d_k]  # (d, d_k)
        w_k = weights_in.w_k[:, g * d_k:(g + 1) * d_k]
        sinusoidal = sinusoidal_score_grid(trace.embeddings[qi], trace.embeddings[ki], n, w_q=w_q, w_k=w_k)
        width = f"q and k of width {d_k}"
        added = "((x_q + P_i) W_q)·((x_k + P_j) W_k)"
        rotary = None  # the trace was built with RoPE, so d_k is even: every feature turns
    else:
        d = trace.embeddings.shape[1]
        if d < 2:
            raise OptionError("--kind rope-distance turns pairs of features: the embeddings need at least 2 (give --dim 2 or more)")
        rotary = d - d % 2  # an odd width keeps its last feature, as explain does
        q, k = trace.embeddings[qi], trace.embeddings[ki]  # (d,) each
        sinusoidal = sinusoidal_score_grid(q, k, n)
        width = f"RoPE turns features 0-{rotary - 1} and keeps feature {d - 1}" if rotary < d else f"all {d} features"
        added = "(x_q + P_i)·(x_k + P_j)"
    titles = [
        "RoPE: q·k after turning q to position i and k to position j: the same along every diagonal (i - j fixed)",
        f"Sinusoidal added to X: {added}: changes along the diagonals",
    ]
    title = f"One pair, {pair}, placed at every pair of positions 0-{n - 1} ({where}; {width})"
    return RopeDistancePicture(rope_score_grid(q, k, n, rotary_dim=rotary), sinusoidal, titles, title)


def rope_pairs_shown(pairs: int) -> list[int]:
    """Which of a width's ``pairs`` feature pairs the RoPE picture turns: 0, pairs/8 and pairs/4
    (theta 1, about 0.32 and 0.1 rad per position at any width of 16 or more), fewer when narrow."""
    return sorted({i for i in (0, max(1, pairs // 8), max(2, pairs // 4)) if i < pairs})


def _positional_figure(config: ExplainConfig, dim: int | None):
    """The sinusoidal table for 64 positions, or RoPE's turn of a few feature pairs at positions 0-7."""
    from selfattn.render.visual import positional_plots

    check_positional_picture(config, dim, POSITIONAL_PICTURE["width"])
    name = positional_picture_name(config)
    width = dim or POSITIONAL_PICTURE["width"]
    positions = POSITIONAL_PICTURE["positions"]
    if name == "sinusoidal":
        table = sinusoidal_encoding(positions, width)
        title = f"Sinusoidal positional encoding ({positions} positions × {width} features)"
        return positional_plots.positional_figure(table, title=title)
    # RoPE adds no table: it turns each feature pair of q and k by m theta_i at position m.
    # Every pair starts at (1, 0), so pair i at position m reads (cos m theta_i, sin m theta_i).
    positions = ROPE_TURN_POSITIONS
    unit = torch.zeros(positions, width, dtype=torch.float64)
    unit[:, 0::2] = 1.0
    turned = apply_rope(unit)  # (positions, width): row m is the vector at position m
    pairs = rope_pairs_shown(width // 2)
    shown = torch.stack([turned[:, [2 * i, 2 * i + 1]] for i in pairs], dim=1)  # (positions, len(pairs), 2)
    thetas = rope_angles(torch.tensor([1]), width)[0, pairs].tolist()  # the angle at position 1 is theta_i
    title = (f"RoPE adds no table: at position m it turns each feature pair i of q and k by the angle m·θ_i, "
             f"θ_i = 10000^(-2i/{width}). Here pairs {', '.join(map(str, pairs))} of {width // 2}, "
             f"each starting at (1, 0), at positions 0-{positions - 1}; later pairs turn slower still")
    return positional_plots.rope_turns_figure(shown, pairs, thetas, title=title)


# Tiles of the block map in `plot --kind mask`: a short sentence gets small tiles; a long one
# tiles big enough that the map has at most MAX_DEFAULT_TILES per axis, as a kernel's blocks would.
DEFAULT_TILE = 2
MAX_DEFAULT_TILES = 32


def default_tile(n: int) -> int:
    """The block map's tile for n keys: DEFAULT_TILE, or the power of two that keeps the tiles to MAX_DEFAULT_TILES."""
    tile = DEFAULT_TILE
    while -(-n // tile) > MAX_DEFAULT_TILES:
        tile *= 2
    return tile
