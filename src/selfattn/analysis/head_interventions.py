"""Change a model's heads and watch what follows: knock heads out (``ablate``), patch them in (``patch_heads``).

In every attention layer the heads' outputs stand side by side before the output projection:

    z      = (z_0, z_1, ..., z_(H-1))                    (batch, H, seq, d_head)
    Y      = concat(z) W_o                               (batch, seq, d_model)

An intervention rewrites head h's z_h at the layer's named point ``blocks.{l}.attn.hook_z``
(``analysis.hooks``; the model's code and weights stay as they are). Every attention path
(reference, flash) and the trace pass that point, so the intervention holds in every
forward, generate and trace.

    zero      z_h := 0
    mean      z_h := its mean over the positions of the batch being run (padding left
              out); while generation continues from a cache, over every position run so far
    patch     z_h := the same head's output on another input (activation patching)

Patching asks which heads carry what makes two inputs differ: run the corrupted input with
one head's output taken from the clean run, and see how much of the clean answer returns:

    recovered = (lp_patched - lp_corrupted) / (lp_clean - lp_corrupted)

lp the log-probability of the target token at the last position: 1 when that head alone
restores the clean answer, 0 when it changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from selfattn.analysis.hooks import capture, hooks, model_blocks
from selfattn.analysis.next_token import gap_warning, next_token_losses, target_id
from selfattn.analysis.inputs import ABLATION_MODES
from selfattn.analysis.path_patching import check_path, check_via, path_patching, path_points
from selfattn.attention.modules import MultiHeadAttention
from selfattn.attention.points import Point, point_name
from selfattn.errors import ModelError, OptionError, SentenceError, did_you_mean
from selfattn.models.tokenizer import Encoded

ROW_TOKENS = 4096  # rows x positions per batched forward of the per-head runs
LOGIT_CELLS = 1 << 25  # and rows x positions x vocabulary of its logits (128 MB in float32)


def attention_modules(model) -> list[MultiHeadAttention]:
    """Each layer's ``MultiHeadAttention``, in order.

    Args:
        model: one of selfattn's models (``load_pretrained``, ``train``, ``Transformer``):
            anything whose ``blocks`` (or ``layers``) each have an ``attention``.

    Returns:
        The attention modules, layer 0 first.

    Raises:
        ModelError: the model has no such layers.
    """
    return [block.attention for block in model_blocks(model)]


def check_heads(model, heads) -> list[tuple[int, int]]:
    """The heads ``[(layer, head), ...]`` checked against the model, duplicates dropped, in the order given.

    Raises:
        OptionError: heads is not a list of (layer, head) pairs of ints, or a layer or
            head is out of range.
    """
    modules = attention_modules(model)
    if isinstance(heads, (str, bytes)) or not hasattr(heads, "__iter__"):
        raise OptionError(f"heads must be a list of (layer, head) pairs, got {heads!r}")
    chosen = []
    for pair in heads:
        if (not isinstance(pair, (tuple, list)) or len(pair) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in pair)):
            raise OptionError(f"each head is a (layer, head) pair of whole numbers, got {pair!r}")
        layer, head = pair
        if not 0 <= layer < len(modules):
            raise OptionError(f"layer {layer} is out of range: this model has {len(modules)} layers, 0 to {len(modules) - 1}")
        n_heads = modules[layer].config.n_heads
        if not 0 <= head < n_heads:
            raise OptionError(f"head {head} is out of range: layer {layer} has {n_heads} heads, 0 to {n_heads - 1}")
        if (layer, head) not in chosen:
            chosen.append((layer, head))
    return chosen


@contextmanager
def ablate(model, heads, mode: str = "zero") -> Iterator:
    """Knock heads out inside a ``with`` block: every forward, generate and trace of ``model`` runs without them.

    head_h := 0 ("zero"), or its mean over the positions of the batch being run ("mean":
    padding positions left out; a generation that continues from its cache keeps a
    running mean over every position run so far), before the output projection.
    The model is exactly as before after the block, also when the block raises.

    Args:
        model: one of selfattn's models (``load_pretrained``, ``train``, ``Transformer``).
        heads: the heads to knock out, ``[(layer, head), ...]``, from 0.
        mode: "zero" (default) or "mean".

    Yields:
        The model.

    Raises:
        ModelError: the model has no attention layers of selfattn's.
        OptionError: an unknown mode, or a head or layer out of range.

    Examples:
        >>> import selfattn as sa
        >>> model = sa.load_pretrained("tiny-induction")
        >>> with sa.ablate(model, [(1, 0), (1, 1)]):
        ...     knocked = model("abcab").logits
        >>> bool((knocked != model("abcab").logits).any())
        True
    """
    if mode not in ABLATION_MODES:
        raise OptionError(f"unknown ablation mode {mode!r}: choose one of {', '.join(ABLATION_MODES)}"
                          f"{did_you_mean(mode, ABLATION_MODES)}")
    with knocked_out(model, check_heads(model, heads), mode):
        yield model


def knocked_out(model, heads: list[tuple[int, int]], mode: str):
    """``ablate`` on heads and a mode already checked (``check_heads``, ``ABLATION_MODES``): a context manager."""
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        by_layer.setdefault(layer, []).append(head)
    return hooks(model, {point_name(layer, "z"): _Knockout(layer_heads, mode) for layer, layer_heads in by_layer.items()})


class _Knockout:
    """A hook on one layer's z: its knocked-out heads zeroed, or set to their mean over the real positions.

    The mean's running sum is the knock-out's own: a call that continues a cache
    (``point.past`` > 0) adds to it, a fresh call starts it again.
    """

    def __init__(self, heads: list[int], mode: str) -> None:
        self.heads, self.mode = heads, mode
        self.total, self.count = None, 0.0  # the mean's running sum (k, d_head) and weight

    def __call__(self, z: torch.Tensor, point: Point) -> torch.Tensor:
        z = z.clone()  # (batch, H, q_len, d_head)
        if self.mode == "zero":
            z[:, self.heads] = 0
        else:
            z[:, self.heads] = self._mean(z[:, self.heads], point)[None, :, None].to(z.dtype)
        return z

    def _mean(self, values: torch.Tensor, point: Point) -> torch.Tensor:
        """values (batch, k, q_len, d_head) -> their mean over the real positions (k, d_head), running with a cache."""
        batch, _, q_len, _ = values.shape
        weight = torch.ones(batch, q_len, dtype=torch.float64) if point.real is None else point.real.to(torch.float64)
        total = (values.double() * weight[:, None, :, None]).sum(dim=(0, 2))  # (k, d_head)
        count = float(weight.sum())
        if point.past > 0 and self.total is not None:
            total, count = total + self.total, count + self.count
        self.total, self.count = total, count
        return total / max(count, 1.0)


def run_keeping(model, encoded: Encoded, names: list[str]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Run the model once, keeping the values at some points.   -> last logits (batch, 1, vocab), {name: value}"""
    with capture(model, names) as seen, torch.no_grad():
        logits = model.run(encoded, last_only=True).logits
    return logits, dict(seen)


def per_head_runs(model, encoded: Encoded, measure, sources: list[torch.Tensor] | None = None,
                  last_only: bool = True, positions: list[int] | None = None) -> torch.Tensor:
    """For every head alone, run ``encoded`` with that head replaced, and measure.   -> (n_layers, n_heads) float64

    z_h := 0 (sources None) or sources[layer][:, h] (patching). The runs are rows of
    batched forwards, one head per row.

    Args:
        model: a decoder.
        encoded: one input, batch 1, unpadded.
        measure: (rows, seq or 1, vocab) logits -> (rows,) numbers.
        sources: per layer every head's output on the clean input, (1, H, seq, d_head).
        last_only: only the last position's logits are needed.
        positions: replace the head only at these positions (None: every position).
    """
    modules = attention_modules(model)
    shape = (len(modules), modules[0].config.n_heads)
    if any(m.config.n_heads != shape[1] for m in modules):
        raise ModelError("per-head runs need the same number of heads in every layer")
    pairs = [(layer, head) for layer in range(shape[0]) for head in range(shape[1])]
    seq = encoded.input_ids.shape[1]
    logit_cells = (1 if last_only else seq) * model.config.vocab_size  # per row
    chunk = max(1, min(ROW_TOKENS // seq, LOGIT_CELLS // logit_cells))
    results = []
    for start in range(0, len(pairs), chunk):
        rows = pairs[start:start + chunk]
        table = {point_name(layer, "z"): _row_patch(layer, rows, sources, positions) for layer in {l for l, _ in rows}}
        batch = Encoded(encoded.tokens * len(rows), encoded.input_ids.expand(len(rows), -1),
                        encoded.attention_mask.expand(len(rows), -1))
        with hooks(model, table), torch.no_grad():
            logits = model.run(batch, last_only=last_only).logits  # (rows, 1 or seq, vocab)
        results.append(measure(logits).double())
    return torch.cat(results).reshape(shape)


def _row_patch(layer: int, rows: list[tuple[int, int]], sources, positions=None):
    """A hook on layer ``layer``'s z that replaces, in row r, head rows[r][1] when rows[r][0] is this layer
    (at ``positions`` only, when given)."""
    mine = [(r, head) for r, (l, head) in enumerate(rows) if l == layer]
    at = slice(None) if positions is None else positions

    def hook(z: torch.Tensor, point: Point) -> torch.Tensor:
        z = z.clone()  # (rows, H, seq, d_head)
        for r, head in mine:
            z[r, head, at] = 0 if sources is None else sources[layer][0, head, at]
        return z

    return hook


def patch_heads(model, clean, corrupted, target, senders=None, receivers=None, via=None,
                positions=None) -> torch.Tensor:
    """Activation patching (how much of the clean answer each head alone brings back), or path patching.

    recovered = (lp_patched - lp_corrupted) / (lp_clean - lp_corrupted), lp the
    log-probability of ``target`` at the last position.

    Without senders and receivers, lp_patched[l, h] comes from the corrupted input with
    head (l, h)'s output taken from the clean run (at every position, or at ``positions``).
    With them, from the corrupted input where only the senders' clean outputs reach only
    the receivers' chosen inputs (``via``), everything else as in the corrupted run
    (``analysis.path_patching``).

    Args:
        model: a decoder (``load_pretrained``, ``train``).
        clean: the input whose answer is the target: a text, or a list of token ids.
        corrupted: an input of the same token length that changes the answer.
        target: the token whose log-probability is read: an id, or a string (as the
            vocabulary writes it, or a text of one token).
        senders: path patching's senders, [(layer, head), ...], all before every receiver.
        receivers: path patching's receivers, [(layer, head), ...].
        via: which inputs of the receivers take the senders' clean output: "q", "k", "v"
            or several ("qkv", the default). With grouped key/value heads, k and v are a
            key/value head's, shared with the other query heads of its group.
        positions: the positions (from 0) where a head's (or the senders') clean output
            is let in; None: every position.

    Returns:
        float64 (n_layers, n_heads); with senders and receivers one number (a 0-d tensor).

    Raises:
        ModelError: the model is not a decoder of selfattn's.
        SentenceError: an input is not one text, or the two differ in token length.
        OptionError: the target is not one token of the vocabulary; the two inputs give it
            the same log-probability (nothing to recover); a head out of range; senders
            without receivers (or the other way), a sender not before every receiver, an
            unknown via; a position outside the text.

    Examples:
        >>> import selfattn as sa
        >>> model = sa.load_pretrained("tiny-induction")
        >>> recovered = sa.patch_heads(model, "kqbxkqb", "kqbxkmb", "x")
        >>> recovered.shape
        torch.Size([2, 4])
        >>> path = sa.patch_heads(model, "kqbxkqb", "kqbxkmb", "x", senders=[(0, 2)], receivers=[(1, 2)], via="k")
        >>> path.shape
        torch.Size([])
    """
    run = patching(model, clean, corrupted, target, senders, receivers, via, positions)
    if isinstance(run, Patching):
        return run.recovered
    return torch.tensor(run.recovered, dtype=torch.float64)


@dataclass(frozen=True)
class Patching:
    """An activation-patching run (``patching``).

    Attributes:
        recovered: (n_layers, n_heads) float64, the fraction each head recovers.
        target: the target's id.
        lp_clean: the target's log-probability at the clean input's last position.
        lp_corrupted: the same on the corrupted input.
        clean, corrupted: the two inputs' token ids.
        positions: where each head's clean output was let in (None: every position).
    """

    recovered: torch.Tensor
    target: int
    lp_clean: float
    lp_corrupted: float
    clean: list[int]
    corrupted: list[int]
    positions: list[int] | None = None

    @property
    def warning(self) -> str | None:
        """Why the fractions mean little (``gap_warning``), or None."""
        return gap_warning(self.lp_clean, self.lp_corrupted)


def check_positions(positions, n: int) -> list[int] | None:
    """Positions (from 0) in a text of n tokens, duplicates dropped, in order; None stays None.

    Raises:
        OptionError: not a list of whole numbers from 0 to n - 1.
    """
    if positions is None:
        return None
    if isinstance(positions, (str, bytes)) or not hasattr(positions, "__iter__"):
        raise OptionError(f"positions must be a list of whole numbers from 0 to {n - 1}, got {positions!r}")
    found = list(positions)
    if not found or not all(isinstance(p, int) and not isinstance(p, bool) and 0 <= p < n for p in found):
        raise OptionError(f"positions must be a non-empty list of whole numbers from 0 to {n - 1} (the inputs have "
                          f"{n} tokens), got {found!r}")
    return sorted(set(found))


def patching(model, clean, corrupted, target, senders=None, receivers=None, via=None, positions=None):
    """``patch_heads`` with what it read on the way (see there): a ``Patching``, or with senders and
    receivers a ``PathPatching`` (``analysis.path_patching``)."""
    attention_modules(model)
    if not hasattr(model, "generate") or not getattr(model.attention_info(0), "causal", False):
        raise ModelError(f"patching reads the next token's log-probability: {model.name} is not a decoder")
    path = senders is not None or receivers is not None
    if path:
        if senders is None or receivers is None:
            raise OptionError("path patching needs senders and receivers together")
        senders, receivers = check_heads(model, senders), check_heads(model, receivers)
        check_path(model, senders, receivers)
        via = check_via("qkv" if via is None else via)
    elif via is not None:
        raise OptionError("via names the receivers' inputs: it goes with senders and receivers")
    runs = []
    for name, given in (("clean", clean), ("corrupted", corrupted)):
        encoded = model.tokenize(given)
        if encoded.input_ids.shape[0] != 1:
            raise SentenceError(f"the {name} input must be one text (or one row of ids), got {encoded.input_ids.shape[0]}")
        runs.append(encoded)
    if runs[0].input_ids.shape[1] != runs[1].input_ids.shape[1]:
        raise SentenceError(
            f"patching needs two inputs of the same token length: the clean one has {runs[0].input_ids.shape[1]} tokens, "
            f"the corrupted {runs[1].input_ids.shape[1]}")
    positions = check_positions(positions, runs[0].input_ids.shape[1])
    wanted = target_id(model, target)

    def log_prob(logits: torch.Tensor) -> torch.Tensor:
        return logits[:, -1].double().log_softmax(dim=-1)[:, wanted]  # (rows,)

    # Each input runs once, for its answer and what the patching takes from it: every head's output
    # on the clean run, or for a path the senders' outputs and the receivers' streams on both.
    if path:
        names = path_points(senders, receivers)
        kept = [names, names]
    else:
        kept = [[point_name(layer, "z") for layer in range(len(model_blocks(model)))], []]
    (clean_logits, clean_seen), (corrupted_logits, corrupted_seen) = (
        run_keeping(model, encoded, names) for encoded, names in zip(runs, kept))
    lp_clean, lp_corrupted = float(log_prob(clean_logits)), float(log_prob(corrupted_logits))
    if abs(lp_clean - lp_corrupted) < 1e-6:
        raise OptionError(
            f"the clean and corrupted inputs give the target the same log-probability ({lp_clean:.4f}): there is "
            "nothing to recover; choose inputs that change the answer")
    if path:
        return path_patching(model, runs, (clean_seen, corrupted_seen), wanted, senders, receivers, via, positions,
                             log_prob, lp_clean, lp_corrupted)
    sources = [clean_seen[name] for name in kept[0]]
    patched = per_head_runs(model, runs[1], log_prob, sources, positions=positions)
    return Patching((patched - lp_corrupted) / (lp_clean - lp_corrupted), wanted, lp_clean, lp_corrupted,
                    runs[0].input_ids[0].tolist(), runs[1].input_ids[0].tolist(), positions)


def ablation_losses(model, encoded: Encoded, positions: list[int]) -> tuple[float, torch.Tensor]:
    """The mean loss over ``positions`` with nothing knocked out, and with each head alone zeroed.

    Args:
        model: a decoder.
        encoded: one unpadded input.
        positions: indices into next_token_losses' (seq - 1) axis (``next_token.text_positions``
            or ``probe_positions``).

    Returns:
        (before, after): before a float; after (n_layers, n_heads) float64, after[l, h] the
            mean loss with head (l, h) zeroed.
    """
    index = torch.tensor(positions)
    ids = encoded.input_ids

    def mean_loss(logits: torch.Tensor) -> torch.Tensor:
        return next_token_losses(logits, ids.expand(logits.shape[0], -1))[:, index].mean(dim=-1)  # (rows,)

    with torch.no_grad():
        before = float(mean_loss(model.run(encoded).logits))
    return before, per_head_runs(model, encoded, mean_loss, last_only=False)
