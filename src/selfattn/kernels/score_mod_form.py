"""Which score_mods add a bias: score_mod(s, b, h, q, kv) = s + bias(b, h, q, kv), worked out once per call.

For such a score_mod dS passes through unchanged (d score_mod / d s = 1), so the backward
needs no autograd through it: it recomputes the tile's scores with the score_mod as the
forward did, and only a captured tensor that wants a gradient costs an autograd pass (through
the bias alone). ALiBi, relative-position tables, per-document offsets and a constant are of
this kind; a softcap (tanh), a per-head temperature (s * t) or ``torch.where(cond, s, x)`` are
not, and take the general path: the score_mod is run again under autograd per tile.

The form is read by running the score_mod once on a 2 x 2 probe tile under a
``TorchFunctionMode`` that follows every torch call: a tensor is "s + bias" when it is the
score itself, or the sum (or difference, score side first) of one "s + bias" tensor and one
that does not depend on the score. Anything else that touches the score makes the result
"depends on s" and the score_mod general, and so does any other write in place into a
tensor made from the score (it may reach the score through a view). Like FlexAttention, this assumes the score_mod does
the same torch calls for every tile (no branching on the scores' values).
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

INDEPENDENT, PLUS, DEPENDS = 0, 1, 2  # does not depend on s; s + (something independent); anything else of s

_ADD = {torch.add, torch.Tensor.add, torch.Tensor.__add__, torch.Tensor.__radd__, torch.Tensor.add_,
        torch.Tensor.__iadd__}
_SUB = {torch.sub, torch.subtract, torch.Tensor.sub, torch.Tensor.__sub__, torch.Tensor.sub_, torch.Tensor.__isub__}
# Calls that give back the same numbers (a view, a copy, a no-op dtype change): the form carries over.
_SAME = {torch.Tensor.to, torch.Tensor.contiguous, torch.Tensor.clone, torch.clone, torch.Tensor.expand,
         torch.Tensor.expand_as, torch.Tensor.view, torch.Tensor.reshape, torch.Tensor.detach}


class _FormTracker(TorchFunctionMode):
    """Follows every torch call made inside it, keeping each tensor's form by id (the tensors are kept alive)."""

    def __init__(self, score: torch.Tensor) -> None:
        super().__init__()
        self.forms: dict[int, int] = {id(score): PLUS}
        self.alive: list[torch.Tensor] = [score]
        # A write in place into something made from the score, other than adding an independent term: it may
        # change the score itself through a view (``s[..., :1].mul_(2)``, ``t[i] = 0``) without the score's
        # id being the result's, so the form of every tensor can no longer be trusted.
        self.rewritten = False

    def form(self, value) -> int:
        if isinstance(value, torch.Tensor):
            return self.forms.get(id(value), INDEPENDENT)
        if isinstance(value, (list, tuple)):
            return max((self.form(item) for item in value), default=INDEPENDENT)
        if isinstance(value, dict):
            return max((self.form(item) for item in value.values()), default=INDEPENDENT)
        return INDEPENDENT

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        form = self.result_form(func, args, kwargs, result)
        if _writes_in_place(func) and args and self.form(args[0]) != INDEPENDENT and form != PLUS:
            self.rewritten = True
        for tensor in _tensors(result):
            self.forms[id(tensor)] = max(form, self.forms.get(id(tensor), INDEPENDENT)) if form != PLUS else PLUS
            self.alive.append(tensor)
        return result

    def result_form(self, func, args, kwargs, result) -> int:
        forms = [self.form(a) for a in args] + [self.form(v) for v in kwargs.values()]
        if max(forms, default=INDEPENDENT) == INDEPENDENT:
            return INDEPENDENT
        if func in _SAME and self.form(args[0]) == PLUS and _same_numbers(args[0], result):
            return PLUS
        if (func in _ADD or func in _SUB) and len(args) == 2 and kwargs.get("alpha", 1) == 1 and set(kwargs) <= {"alpha"}:
            first, second = self.form(args[0]), self.form(args[1])
            if first == PLUS and second == INDEPENDENT:
                return PLUS
            if func in _ADD and first == INDEPENDENT and second == PLUS:
                return PLUS
        return DEPENDS


def _writes_in_place(func) -> bool:
    """torch's in-place calls: ``add_``-style methods, ``__iadd__``-style operators and item assignment."""
    name = getattr(func, "__name__", "")
    return name == "__setitem__" or (name.startswith("__i") and name.endswith("__")) or (
        name.endswith("_") and not name.startswith("_"))


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def _same_numbers(source, result) -> bool:
    return isinstance(result, torch.Tensor) and isinstance(source, torch.Tensor) and result.dtype == source.dtype


def adds_a_bias(fn, b: torch.Tensor, h: torch.Tensor, dtype: torch.dtype, device=None) -> bool:
    """Whether ``fn(score, b, h, q_idx, kv_idx)`` is score + something that does not depend on score.

    Args:
        fn: the user's score_mod.
        b, h: the batch and head index tensors it will see (``masks.block_mask.mask_indices``).
        dtype, device: the scores'.

    Returns:
        True only when every call on the way from the score to the result is an add (or a
        subtraction of something else from it) or keeps the numbers as they are; False for
        anything else, and when the probe raises (the real call then reports the error).
    """
    score = torch.zeros((b.shape[0], h.shape[1], 2, 2), dtype=dtype, device=device)
    q_idx = torch.arange(2, device=device).view(1, 1, -1, 1)
    kv_idx = torch.arange(2, device=device).view(1, 1, 1, -1)
    tracker = _FormTracker(score)
    try:
        with torch.no_grad(), tracker:
            result = fn(score, b, h, q_idx, kv_idx)
    except Exception:  # noqa: BLE001 - the real call raises it again, with our message
        return False
    return (isinstance(result, torch.Tensor) and tracker.form(result) == PLUS and result.dtype == dtype
            and not tracker.rewritten)
