"""`selfattn plot` and `selfattn view`: from a configuration to a picture or a page on disk.

Every check that can fail (the output path, the kind, the layer and head, the mask
spec) runs before any file is touched; files are written atomically.
"""

from __future__ import annotations

from pathlib import Path

import torch

from selfattn.config import ExplainConfig, build_trace
from selfattn.errors import OptionError
from selfattn.masks import causal_bottom_right, causal_top_left, padding_mask, sliding_window_mask
from selfattn.positional import apply_rope, sinusoidal_encoding
from selfattn.trace import Trace
from selfattn.variant_trace import VariantTrace
from selfattn.viz import PLOT_KINDS
from selfattn.viz.output import check_output_path, write_text

PAGE_EXTENSIONS = (".html", ".htm")
POSITIONAL_PICTURE = {"positions": 64, "width": 64}  # an encoding is drawn for 64 positions x 64 features


def attention_weights(trace: Trace | VariantTrace) -> torch.Tensor:
    """Every layer's and head's weights.   -> (layers, heads, n, n)"""
    if isinstance(trace, Trace):
        return trace.weights[None, None]  # (1, 1, n, n)
    return trace.weights[None]  # (1, H, n, n)


def query_index(trace: Trace | VariantTrace) -> int:
    return trace.query.index if isinstance(trace, Trace) else trace.query_index


def check_layer_head(weights: torch.Tensor, layer: int, head: int) -> None:
    n_layers, n_heads = weights.shape[:2]
    for name, value, count in (("--layer", layer, n_layers), ("--head", head, n_heads)):
        if not 0 <= value < count:
            noun = name.removeprefix("--")
            raise OptionError(
                f"{name} {value} is out of range: this input has {count} {noun}{'s' if count > 1 else ''} "
                f"(0 to {count - 1})"
            )


def plot(
    config: ExplainConfig,
    kind: str,
    output: str,
    *,
    layer: int = 0,
    head: int = 0,
    mask: str | None = None,
    dim: int | None = None,
) -> Path:
    """Draw ``kind`` for the configured input and save it as PNG or SVG."""
    from selfattn.viz import plots

    target = plots.check_output_path(output)
    if kind not in PLOT_KINDS:
        raise OptionError(f"unknown plot kind {kind!r}: choose one of {', '.join(PLOT_KINDS)}")
    if mask is not None and kind != "mask":
        raise OptionError("--mask applies to --kind mask")
    if kind == "positional":
        figure = _positional_figure(config, dim)
        return plots.save_figure(figure, target)

    trace = build_trace(config)
    weights = attention_weights(trace)  # (layers, heads, n, n)
    check_layer_head(weights, layer, head)
    tokens = trace.tokens
    variant = "simple" if isinstance(trace, Trace) else trace.variant
    where = f"layer {layer}, head {head}" if weights.shape[1] > 1 else variant
    if kind == "heatmap":
        figure = plots.heatmap_figure(weights[layer, head], tokens, tokens, title=f"Attention weights ({where})")
    elif kind == "arrows":
        q = query_index(trace)
        figure = plots.arrows_figure(tokens, weights[layer, head, q], q, title=f"Where '{tokens[q]}' looks ({where})")
    elif kind == "heads":
        names = [f"head {h}" for h in range(weights.shape[1])]
        figure = plots.heads_figure(weights, tokens, head_names=names, title=f"Attention weights of every head ({variant})")
    else:
        allowed, rows, columns, title = mask_picture(mask, trace)
        figure = plots.mask_figure(allowed, rows, columns, title=title)
    return plots.save_figure(figure, target)


def view(config: ExplainConfig, output: str, *, layer: int = 0, head: int = 0) -> Path:
    """Write the interactive explorer for the configured input as one HTML file."""
    from selfattn.viz.explorer import explorer_html

    target = check_output_path(output, PAGE_EXTENSIONS)
    trace = build_trace(config)
    check_layer_head(attention_weights(trace), layer, head)
    return write_text(target, explorer_html(trace, config.precision, head=head))


def mask_picture(spec: str | None, trace: Trace | VariantTrace) -> tuple[torch.Tensor, list[str], list[str], str]:
    """(mask (q_len, kv_len), query labels, key labels, title) for a --mask spec, or the variant's own mask."""
    tokens = list(trace.tokens)
    n = len(tokens)
    if spec is None:
        own = None if isinstance(trace, Trace) else trace.mask
        if own is not None:
            return own, tokens, tokens, "Causal mask (top-left): no token sees a later one"
        return torch.ones(n, n, dtype=torch.bool), tokens, tokens, "No mask: every token may attend to every token"
    name, colon, argument = spec.partition(":")
    value = None
    if colon:
        if not argument.isdigit():
            raise OptionError(f"the number after ':' in --mask {spec!r} must be a whole number >= 0")
        value = int(argument)
    if name == "none" and value is None:
        return torch.ones(n, n, dtype=torch.bool), tokens, tokens, "No mask"
    if name == "causal" and value is None:
        return causal_top_left(n), tokens, tokens, "Causal mask, aligned top-left (torch's is_causal)"
    if name == "causal-bottom-right":
        past = 3 if value is None else value
        keys = [f"past {i + 1}" for i in range(past)] + tokens
        title = f"Causal mask, aligned bottom-right: {past} cached keys before the sentence"
        return causal_bottom_right(n, n + past), tokens, keys, title
    if name == "sliding-window":
        window = 3 if value is None else value
        if window < 1:
            raise OptionError(f"the sliding window must hold at least 1 token, got {window}")
        return sliding_window_mask(n, left=window - 1), tokens, tokens, f"Causal sliding window of {window} tokens"
    if name == "padding":
        length = max(n - 2, 1) if value is None else value
        if not 0 <= length <= n:
            raise OptionError(f"padding:{length} needs a length from 0 to the {n} tokens of the sentence")
        keys = tokens[:length] + [f"[pad] {t}" for t in tokens[length:]]
        allowed = padding_mask([length], n)[0, 0].expand(n, n)  # (1, 1, 1, n) -> (n, n)
        return allowed, tokens, keys, f"Padding mask: keys after the first {length} are padding"
    raise OptionError(
        f"unknown mask {spec!r}: use causal, causal-bottom-right[:P], sliding-window[:W], padding[:L] or none"
    )


def _positional_figure(config: ExplainConfig, dim: int | None):
    """The sinusoidal table, or RoPE's rotation of the vector (1, 0, 1, 0, ...), for 64 positions."""
    from selfattn.viz import plots

    name = "sinusoidal" if config.positional == "none" else config.positional
    width = dim or POSITIONAL_PICTURE["width"]
    positions = POSITIONAL_PICTURE["positions"]
    if name == "sinusoidal":
        table = sinusoidal_encoding(positions, width)
        title = f"Sinusoidal positional encoding ({positions} positions × {width} features)"
    elif name == "rope":
        if width % 2:
            raise OptionError(f"RoPE turns pairs of features, so --dim must be even, got {width}")
        unit = torch.zeros(positions, width)
        unit[:, 0::2] = 1.0  # every pair starts at (1, 0): after the turn it reads (cos, sin)
        table = apply_rope(unit)
        title = f"RoPE: each feature pair turned by position × frequency ({positions} positions × {width} features)"
    else:
        raise OptionError(f"--kind positional draws sinusoidal or rope encodings, not {name}")
    return plots.positional_figure(table, title=title)
