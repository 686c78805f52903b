"""Change a model's heads and watch what follows: knock heads out (``ablate``), patch them in (``patch_heads``).

In every attention layer the heads' outputs stand side by side before the output projection:

    concat = [head_0 | head_1 | ... | head_(H-1)]      (batch, seq, H * d_head)
    Y      = concat W_o                                  (batch, seq, d_model)

so head h of a layer is the slice concat[..., h d_head : (h + 1) d_head], and what the
layer adds to the residual stream is the sum of each head's slice times its rows of W_o.
An intervention rewrites that slice on its way into W_o, through a forward pre-hook on the
layer's ``w_o`` (hooks on a named point, as TransformerLens does; the model's code and
weights stay as they are). Every attention path (reference, packed, flash) and the trace
go through ``w_o``, so the intervention holds in every forward, generate and trace.

    zero      head_h := 0
    mean      head_h := its mean over the positions of the batch being run (padding left
              out); while generation continues from a cache, over every position run so far
    patch     head_h := the same head's output on another input (activation patching)

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

from selfattn.analysis.next_token import next_token_losses, target_id
from selfattn.analysis.inputs import ABLATION_MODES
from selfattn.attention.modules import MultiHeadAttention
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
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        blocks = getattr(model, "layers", None)
    found = [getattr(block, "attention", None) for block in blocks] if blocks is not None else []
    if not found or not all(isinstance(m, MultiHeadAttention) for m in found):
        raise ModelError(
            f"{type(model).__name__} has no attention layers of selfattn's: heads can be knocked out or patched in "
            "selfattn's models (load_pretrained, train, Transformer)")
    return found


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
    modules = attention_modules(model)
    by_layer: dict[int, list[int]] = {}
    for layer, head in check_heads(model, heads):
        by_layer.setdefault(layer, []).append(head)
    knockouts = {layer: _Knockout(modules[layer], layer_heads, mode) for layer, layer_heads in by_layer.items()}
    hooks = [(modules[layer], k.see_call, True) for layer, k in knockouts.items()]
    hooks += [(modules[layer].w_o, k.replace, False) for layer, k in knockouts.items()]
    with _pre_hooks(hooks):
        yield model


@contextmanager
def _pre_hooks(hooks) -> Iterator[None]:
    """Forward pre-hooks [(module, hook, with_kwargs)] in place for a block, removed after it whatever happens."""
    handles = []
    try:
        for module, hook, with_kwargs in hooks:
            handles.append(module.register_forward_pre_hook(hook, with_kwargs=with_kwargs))
        yield
    finally:
        for handle in handles:
            handle.remove()


class _Knockout:
    """One layer's knocked-out heads: ``see_call`` notes the call's padding and cache, ``replace`` rewrites concat."""

    def __init__(self, module: MultiHeadAttention, heads: list[int], mode: str) -> None:
        self.heads, self.mode = heads, mode
        self.n_heads, self.d_head = module.config.n_heads, module.config.d_head
        self.call = None  # (real queries (batch, q_len) bool or None, continues a cache)
        self.total, self.count = None, 0  # the mean's running sum (k, d_head) and weight

    def see_call(self, module, args, kwargs):
        cache = kwargs.get("cache")
        query = args[0] if args else kwargs["query"]
        q_len = query.shape[-2]
        self.call = (real_queries(kwargs.get("attn_mask"), q_len), cache is not None and cache.length > 0)

    def replace(self, module, args):
        (concat,) = args  # (batch, q_len, H d_head), or (q_len, H d_head) unbatched
        call, self.call = self.call, None  # a trace's direct steps() call has no see_call: all positions, fresh
        x = concat if concat.dim() == 3 else concat[None]  # (batch, q_len, H d_head)
        batch, q_len, _ = x.shape
        split = x.reshape(batch, q_len, self.n_heads, self.d_head).clone()  # (batch, q_len, H, d_head)
        if self.mode == "zero":
            split[:, :, self.heads] = 0
        else:
            split[:, :, self.heads] = self._mean(split[:, :, self.heads], call).to(split.dtype)
        out = split.reshape(batch, q_len, self.n_heads * self.d_head)
        return (out if concat.dim() == 3 else out[0],)

    def _mean(self, values: torch.Tensor, call) -> torch.Tensor:
        """values (batch, q_len, k, d_head) -> their mean over the real positions (k, d_head), running with a cache."""
        real, continues = call if call is not None else (None, False)
        weight = torch.ones(values.shape[:2], dtype=torch.float64) if real is None else real.to(torch.float64)
        total = (values.double() * weight[..., None, None]).sum(dim=(0, 1))  # (k, d_head)
        count = float(weight.sum())
        if continues and self.total is not None:
            total, count = total + self.total, count + self.count
        self.total, self.count = total, count
        return total / max(count, 1.0)


def real_queries(attn_mask, q_len: int) -> torch.Tensor | None:
    """Which of a call's queries are real tokens, read from its mask.   -> (batch or 1, q_len) bool, or None

    The last query of a padded batch is a real token (left padding puts every row's newest
    token last; right padding leaves an encoder's keys masked for every query), so the keys
    its row may see are the real ones; the queries are the last q_len keys.
    None when the call has no mask: every position is real.
    """
    if not isinstance(attn_mask, torch.Tensor) or attn_mask.dim() < 2:
        return None
    seen = attn_mask if attn_mask.dtype == torch.bool else attn_mask > torch.finfo(attn_mask.dtype).min / 2
    last = seen[..., -1, :]  # (..., kv_len): what the last query may see
    last = last.reshape(last.shape[0], -1, last.shape[-1]).any(dim=1) if last.dim() > 1 else last[None]  # (batch or 1, kv_len)
    return last[:, last.shape[-1] - q_len:]  # (batch or 1, q_len)


def capture_heads(model, encoded: Encoded) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Run the model once and keep what each layer's W_o read.   -> last logits (batch, 1, vocab), n_layers x (batch, seq, H d_head)"""
    modules = attention_modules(model)
    seen: list[torch.Tensor | None] = [None] * len(modules)
    hooks = [(m.w_o, lambda _, args, i=i: seen.__setitem__(i, args[0].detach()), False) for i, m in enumerate(modules)]
    with _pre_hooks(hooks), torch.no_grad():
        logits = model.run(encoded, last_only=True).logits
    return logits, seen


def per_head_runs(model, encoded: Encoded, measure, sources: list[torch.Tensor] | None = None,
                  last_only: bool = True) -> torch.Tensor:
    """For every head alone, run ``encoded`` with that head replaced, and measure.   -> (n_layers, n_heads) float64

    head_h := 0 (sources None) or sources[layer][..., h] (patching). The runs are rows of
    batched forwards, one head per row.

    Args:
        model: a decoder.
        encoded: one input, batch 1, unpadded.
        measure: (rows, seq or 1, vocab) logits -> (rows,) numbers.
        sources: per layer what W_o read on the clean input, (1, seq, H d_head).
        last_only: only the last position's logits are needed.
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
        hooks = [(m.w_o, _row_patch(layer, m, rows, sources), False) for layer, m in enumerate(modules)]
        batch = Encoded(encoded.tokens * len(rows), encoded.input_ids.expand(len(rows), -1),
                        encoded.attention_mask.expand(len(rows), -1))
        with _pre_hooks(hooks), torch.no_grad():
            logits = model.run(batch, last_only=last_only).logits  # (rows, 1 or seq, vocab)
        results.append(measure(logits).double())
    return torch.cat(results).reshape(shape)


def _row_patch(layer: int, module: MultiHeadAttention, rows: list[tuple[int, int]], sources):
    """A W_o pre-hook that replaces, in row r, head rows[r][1] when rows[r][0] is this layer."""
    mine = [(r, head) for r, (l, head) in enumerate(rows) if l == layer]
    d = module.config.d_head

    def hook(_, args):
        if not mine:
            return None
        concat = args[0].clone()  # (rows, seq, H d_head)
        for r, head in mine:
            span = slice(head * d, (head + 1) * d)
            concat[r, :, span] = 0 if sources is None else sources[layer][0, :, span]
        return (concat,)

    return hook


def patch_heads(model, clean, corrupted, target) -> torch.Tensor:
    """Activation patching: how much of the clean answer each head alone brings back.   -> (n_layers, n_heads)

    recovered[l, h] = (lp_patched - lp_corrupted) / (lp_clean - lp_corrupted), lp the
    log-probability of ``target`` at the last position; lp_patched from the corrupted input
    with head (l, h)'s output (at every position) taken from the clean run.

    Args:
        model: a decoder (``load_pretrained``, ``train``).
        clean: the input whose answer is the target: a text, or a list of token ids.
        corrupted: an input of the same token length that changes the answer.
        target: the token whose log-probability is read: an id, or a string (as the
            vocabulary writes it, or a text of one token).

    Returns:
        float64 (n_layers, n_heads).

    Raises:
        ModelError: the model is not a decoder of selfattn's.
        SentenceError: an input is not one text, or the two differ in token length.
        OptionError: the target is not one token of the vocabulary, or the two inputs give
            it the same log-probability (nothing to recover).

    Examples:
        >>> import selfattn as sa
        >>> model = sa.load_pretrained("tiny-induction")
        >>> recovered = sa.patch_heads(model, "kqbxkqb", "kqbxkmb", "x")
        >>> recovered.shape
        torch.Size([2, 4])
    """
    return patching(model, clean, corrupted, target).recovered


@dataclass(frozen=True)
class Patching:
    """An activation-patching run (``patching``).

    Attributes:
        recovered: (n_layers, n_heads) float64, the fraction each head recovers.
        target: the target's id.
        lp_clean: the target's log-probability at the clean input's last position.
        lp_corrupted: the same on the corrupted input.
        clean, corrupted: the two inputs' token ids.
    """

    recovered: torch.Tensor
    target: int
    lp_clean: float
    lp_corrupted: float
    clean: list[int]
    corrupted: list[int]


def patching(model, clean, corrupted, target) -> Patching:
    """``patch_heads`` with what it read on the way: the two log-probabilities and the inputs' ids (see there)."""
    attention_modules(model)
    if not hasattr(model, "generate") or not getattr(model.attention_info(0), "causal", False):
        raise ModelError(f"patching reads the next token's log-probability: {model.name} is not a decoder")
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
    wanted = target_id(model, target)

    def log_prob(logits: torch.Tensor) -> torch.Tensor:
        return logits[:, -1].double().log_softmax(dim=-1)[:, wanted]  # (rows,)

    clean_logits, sources = capture_heads(model, runs[0])  # the clean run once: its answer and its heads
    with torch.no_grad():
        corrupted_logits = model.run(runs[1], last_only=True).logits
    lp_clean, lp_corrupted = float(log_prob(clean_logits)), float(log_prob(corrupted_logits))
    gap = lp_clean - lp_corrupted
    if abs(gap) < 1e-6:
        raise OptionError(
            f"the clean and corrupted inputs give the target the same log-probability ({lp_clean:.4f}): there is "
            "nothing to recover; choose inputs that change the answer")
    patched = per_head_runs(model, runs[1], log_prob, sources)
    return Patching((patched - lp_corrupted) / gap, wanted, lp_clean, lp_corrupted,
                    runs[0].input_ids[0].tolist(), runs[1].input_ids[0].tolist())


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
