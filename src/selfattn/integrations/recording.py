"""A model's attention calls, kept small, to read exact attention weights after a forward.

While a ``Recording`` is active, every call of the transformers adapter's attention
function (``selfattn.integrations.transformers.flash_attention_forward``) made by one of
the recorded model's modules keeps what that call's weights need and nothing quadratic per
head: the query (B, Hq, q_len, d), the key (B, Hk, kv_len, d), the kernel's lse
(B, Hq, q_len), the scale, the causal rule and the GQA setting, and the mask by reference
(transformers builds one per forward and hands the same tensor to every layer).
``Recording.probs`` rebuilds the rows asked for with ``attention_probs_from_lse``:

    P_ij = exp(scale q_i . k_j + mask_ij - lse_i)

Calls map to layers by the module's ``layer_idx`` where it has one, else by the order in
which the modules first called. Each layer keeps its latest call. The active recordings
sit in a module-level list that a block leaves in ``finally``, so once the block is over
(also by an exception) nothing more is recorded. This module knows nothing of
transformers; ``selfattn.integrations.transformers.recording`` is the entry point.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from selfattn.errors import ModelError
from selfattn.kernels.flash import flash_attention
from selfattn.kernels.probs_from_lse import attention_probs_from_lse

ACTIVE: list[Recording] = []  # the recordings whose blocks are open, innermost last


@dataclass(frozen=True)
class AttentionCall:
    """One attention call as the kernel saw it: what its weights need, nothing q_len x kv_len per head.

    ``attn_mask`` is the mask the kernel was given (bool, True = may attend, or float and
    added to the scores), broadcastable to (B, Hq, q_len, kv_len); it is the tensor the
    model shares between its layers, held, not copied. ``is_causal`` is the top-left rule
    (row i sees keys j <= i); ``scale`` None means 1 / sqrt(d).
    """

    query: torch.Tensor  # (B, Hq, q_len, d)
    key: torch.Tensor  # (B, Hk, kv_len, d); Hk < Hq with enable_gqa
    lse: torch.Tensor  # (B, Hq, q_len): log sum_j exp(scale q_i . k_j + mask_ij)
    attn_mask: torch.Tensor | None
    is_causal: bool
    scale: float | None
    enable_gqa: bool


class Recording:
    """The attention calls of one model inside a ``recording`` block, layer by layer.

    Read it inside the block or after it: ``probs`` for the weights, ``call`` for what was
    kept, ``layers`` for how many layers have called.
    """

    def __init__(self, model: torch.nn.Module):
        self._members = frozenset(id(module) for module in model.modules())  # ids only: the model is not held
        self._calls: dict[int, AttentionCall] = {}  # layer -> its latest call
        self._layer_of: dict[int, int] = {}  # id(module) -> layer
        self._clash: str | None = None

    @property
    def layers(self) -> int:
        """How many layers have been recorded."""
        return len(self._calls)

    def owns(self, module: torch.nn.Module) -> bool:
        """Whether ``module`` is part of the recorded model."""
        return id(module) in self._members

    def add(self, module: torch.nn.Module, call: AttentionCall) -> None:
        """File ``call`` as the latest of ``module``'s layer."""
        layer = self._layer_of.get(id(module))
        if layer is None:
            index = getattr(module, "layer_idx", None)
            numbered = isinstance(index, int) and not isinstance(index, bool)
            layer = index if numbered else len(self._layer_of)
            if layer in self._layer_of.values() and self._clash is None:  # e.g. self- and cross-attention of one block
                self._clash = (f"two attention modules of this model are both layer {layer} (an encoder-decoder?): "
                               "recording cannot tell them apart")
            self._layer_of[id(module)] = layer
        self._calls[layer] = call

    def call(self, layer: int) -> AttentionCall:
        """What layer ``layer``'s latest attention call kept.

        Raises:
            ModelError: nothing has been recorded yet, ``layer`` is not an int, or no layer
                of that number has been recorded.
        """
        if self._clash is not None:
            raise ModelError(self._clash)
        if not self._calls:
            raise ModelError("nothing recorded yet: run a forward of the model inside the recording block")
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise ModelError(f"layer must be an int, got {layer!r}")
        if layer not in self._calls:
            raise ModelError(f"layer {layer} is out of range: the recorded layers are {sorted(self._calls)}")
        return self._calls[layer]

    def probs(self, layer: int, rows, heads=None) -> torch.Tensor:
        """Exact attention weights of chosen query rows.   -> (B, len(heads), len(rows), kv_len)

        P_ij = exp(scale q_i . k_j + mask_ij - lse_i), for the chosen rows i only: the
        q_len x kv_len matrix of all rows is never made. Each real row sums to 1; a row
        that saw no key (a padding position) is all zeros. With dropout in training, these
        are the weights before dropout.

        Args:
            layer: the layer, as ``call`` takes it.
            rows: a list of query positions of that call (ints, negative ones counted from
                the end as in Python); the output keeps their order.
            heads: None for every query head, or a list of head indices in the same form.

        Returns:
            The weights (B, len(heads), len(rows), kv_len) in the query's dtype.

        Raises:
            ModelError: ``call`` refuses the layer; rows or heads are not a non-empty list
                of ints, or one is out of range.
        """
        call = self.call(layer)
        rows = positions("rows", rows, call.query.shape[-2])
        heads = None if heads is None else positions("heads", heads, call.query.shape[-3])
        return attention_probs_from_lse(
            call.query, call.key, call.lse, rows=rows, heads=heads, attn_mask=call.attn_mask,
            is_causal=call.is_causal, scale=call.scale, enable_gqa=call.enable_gqa,
        )


def positions(name: str, values, count: int) -> list[int]:
    """A non-empty list of ints in [-count, count) -> the same positions in [0, count), in order."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__") or len(values) == 0:
        raise ModelError(f"{name} must be a non-empty list of ints, got {values!r}")
    picked = []
    for value in values:
        try:
            index = operator.index(value) if not isinstance(value, bool) else None
        except TypeError:
            index = None
        if index is None:
            raise ModelError(f"{name} must be a non-empty list of ints, got {values!r}")
        if not -count <= index < count:
            raise ModelError(f"{name}: {index} is out of range for {count} (0 to {count - 1}, or negative from the end)")
        picked.append(index % count)
    return picked


@contextmanager
def record(model: torch.nn.Module) -> Iterator[Recording]:
    """Record ``model``'s attention calls for the length of a with block; nested blocks each get every call."""
    recording = Recording(model)
    ACTIVE.append(recording)
    try:
        yield recording
    finally:
        ACTIVE.remove(recording)


def record_call(module: torch.nn.Module, query, key, value, lse: torch.Tensor | None, options: dict) -> None:
    """File one attention call with every active recording of a model ``module`` belongs to.

    query (B, Hq, q_len, d), key and value (B, Hk, kv_len, d), lse (B, Hq, q_len) or None
    where the call took the reference path (weights with autograd, or dropout); then the
    kernel runs once more, without gradients or dropout, for it. ``options`` are the
    kernel's attn_mask, is_causal, scale and enable_gqa.
    """
    owners = [recording for recording in ACTIVE if recording.owns(module)]
    if not owners:
        return
    if lse is None:
        with torch.no_grad():
            lse = flash_attention(query, key, value, return_lse=True, **options)[1]
    # The key is copied: a static cache hands the layers its own buffer and writes into it later.
    call = AttentionCall(query.detach(), key.detach().clone(), lse.detach(), **options)
    for recording in owners:
        recording.add(module, call)
