"""transformers' models on selfattn's flash kernel: ``attn_implementation="selfattn"``.

transformers chooses attention by name from two registries. ``AttentionInterface`` maps
the name to the function each attention layer calls with its projected query, key and
value, (batch, heads, seq, d_head) as here; ``AttentionMaskInterface`` maps it to the
function that builds the mask the layers receive. ``register()`` files
``flash_attention_forward`` under the name in the first, and transformers' own sdpa mask
builder in the second: it returns a bool mask, True = may attend (our convention), with
padding, sliding windows and cache offsets already in it, or None where the layer's
``is_causal`` alone describes the pattern. The function runs ``flash_attention``; it
rebuilds the exact weights from the kernel's lse only when ``output_attentions`` is
asked, and hands weights wanted with autograd or dropout to the reference attention.
``recording(model)`` keeps, for the forwards inside a with block, each layer's q, k and
lse (nothing quadratic per head), from which ``probs`` rebuilds the exact weights of the
rows asked for (``selfattn.integrations.recording``). transformers is imported by
``register()`` and ``recording()`` only, never by ``import selfattn``.

    from selfattn.integrations.transformers import recording, register
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation=register())
    with recording(model) as rec:
        model(ids)
    rec.probs(0, rows=[0, -1])  # (batch, heads, 2, kv_len)
"""

from __future__ import annotations

import re
import sys
from contextlib import AbstractContextManager

import torch

from selfattn.attention.functional import attention_forward
from selfattn.errors import ModelError
from selfattn.integrations.recording import Recording, record, record_call
from selfattn.kernels.flash import flash_attention
from selfattn.kernels.probs_from_lse import attention_probs_from_lse
from selfattn.masks import causal_mask, to_additive

INSTALL_HINT = "install the extra: pip install 'selfattn[transformers]' (or pip install 'transformers>=4.53')"
# transformers reads meaning into some names: "flash" in it switches on its flash-attention
# paths (packed sequences, no padding mask), "owner/repo" or "a:b" means a kernel from the
# Hub, and "paged|" a paged cache. A plain word avoids all of them.
NAME_PATTERN = re.compile(r"[A-Za-z0-9_.-]+")


def register(name: str = "selfattn") -> str:
    """Make ``attn_implementation=name`` run transformers' attention layers on selfattn's kernel.

    Registers ``flash_attention_forward`` with transformers' ``AttentionInterface`` and
    transformers' sdpa mask builder (a bool mask, True = may attend) with its
    ``AttentionMaskInterface``, both under ``name``, for every model loaded afterwards
    (``from_pretrained(..., attn_implementation=name)``) or switched with
    ``model.set_attn_implementation(name)``. Registering the same name again changes nothing.

    Args:
        name: the implementation's name: letters, digits, ``_``, ``.`` and ``-``, without
            "flash" in it (transformers gives such names its flash-attention behaviour).

    Returns:
        The name, to pass as ``attn_implementation``.

    Raises:
        ModelError: transformers is not installed, or too old to have both registries;
            the name is not a non-empty string of the allowed characters, contains
            "flash", or already names another attention implementation or mask builder.
    """
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ModelError(f"the implementation's name must be a non-empty word (letters, digits, _ . -), got {name!r}")
    if "flash" in name.lower():
        raise ModelError(f"transformers treats names with 'flash' as flash-attention builds; rename {name!r}")
    try:
        import transformers  # first alone: to tell "not installed" from "too old"
    except ImportError:
        raise ModelError(f"the transformers adapter needs transformers: {INSTALL_HINT}") from None
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError:
        raise ModelError(
            f"transformers {transformers.__version__} lacks AttentionInterface or AttentionMaskInterface: "
            "upgrade it with pip install -U transformers"
        ) from None
    for registry, ours in ((AttentionInterface, flash_attention_forward), (AttentionMaskInterface, sdpa_mask)):
        present = registry().get(name)  # a fresh instance: exactly the library-wide entries
        if present is not None and present is not ours:
            raise ModelError(f"{name!r} already names another attention implementation in transformers: choose another")
    AttentionInterface.register(name, flash_attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def recording(model: torch.nn.Module) -> AbstractContextManager[Recording]:
    """Record a model's attention calls in a with block, to read exact weights of chosen rows.

    with recording(model) as rec: model(ids)   then   rec.probs(layer, rows, heads) -> (B, len(heads), len(rows), kv_len)

    Each attention layer of ``model`` that calls selfattn's kernel inside the block keeps
    its query (B, Hq, q_len, d), a copy of its key (B, Hk, kv_len, d), the kernel's lse
    (B, Hq, q_len) and the mask (held, not copied: the layers share it), is_causal, scale
    and enable_gqa it ran with: nothing q_len x kv_len per head. ``rec.probs`` rebuilds
    P_ij = exp(scale q_i . k_j + mask_ij - lse_i) for the rows asked for only, exact for
    every mask, causal rule and GQA layout the call had; ``rec.layers`` counts the layers
    recorded, ``rec.call(layer)`` gives what one kept. Layers are numbered by the
    module's ``layer_idx`` where it has one, else in the order they first call. With
    several forwards in the block (``generate``), each layer keeps its latest call (in
    ``generate``, the last decoding step: one query row against the whole cache). When a
    call takes the reference path (weights wanted while autograd tracks, or with dropout)
    the kernel runs once more without gradients for the lse; the weights are those before
    dropout. Nested blocks, also of the same model, each record every call of their model.
    After the block, also one left by an exception, nothing more is recorded; the record
    stays readable.

    Args:
        model: a transformers model whose attention implementation (``config._attn_implementation``)
            is a name ``register()`` filed, "selfattn" or another.

    Returns:
        A context manager; ``with`` gives the ``Recording``.

    Raises:
        ModelError: transformers is not installed, or the model's attention implementation
            is not one registered to selfattn's kernel (``rec.probs`` raises it too, for a
            layer, row or head that is not there).
    """
    try:
        from transformers import AttentionInterface
    except ImportError:
        raise ModelError(f"recording a transformers model needs transformers: {INSTALL_HINT}") from None
    name = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if not isinstance(model, torch.nn.Module) or not isinstance(name, str) or (
        AttentionInterface().get(name) is not flash_attention_forward
    ):
        raise ModelError(
            f"recording needs a model loaded with attn_implementation=register() (selfattn's kernel); "
            f"this {type(model).__name__} runs attention implementation {name!r}"
        )
    return record(model)


def flash_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A transformers attention call on ``flash_attention``.   (B, Hq, q_len, d), (B, Hk, kv_len, d) -> (B, q_len, Hq, d)

    O = softmax(scaling Q K^T + mask) V with transformers' attention-function signature,
    as ``AttentionInterface`` calls it. The attention is causal exactly when transformers'
    own sdpa path would make it so: no mask, more than one query, and the layer causal
    (``is_causal`` if given, else ``module.is_causal``); the rule is top-left, so a
    prefill into a longer, empty static cache sees only its own keys. A query row that sees
    no key (a padding position) gets zeros. Inside a ``recording`` block of the calling
    model, the call is also recorded.

    Args:
        module: the calling attention layer; its ``training``, ``is_causal`` and (for the
            weights) ``config`` are read.
        query: (B, Hq, q_len, d) queries.
        key: (B, Hk, kv_len, d) keys; Hk divides Hq (grouped-query attention when smaller).
        value: (B, Hk, kv_len, d_v) values.
        attention_mask: None, a bool mask broadcastable to (B, Hq, q_len, kv_len) with
            True = may attend, or a float mask added to the scores.
        scaling: the factor on Q K^T; None means 1 / sqrt(d).
        dropout: chance of zeroing each weight, applied only while ``module.training``,
            inside the kernel (the reference attention when the weights are wanted too,
            so that they are the dropped ones).
        is_causal: overrides ``module.is_causal`` when given.
        **kwargs: the rest of what the layer passes on: ``output_attentions`` (see
            Returns), ``position_bias`` (added to the scores, as T5 does), and keys the mask
            already accounts for (``sliding_window``, ``position_ids``, ...), ignored.

    Returns:
        (output, weights): output (B, q_len, Hq, d_v), contiguous, as the layers expect;
            weights (B, Hq, q_len, kv_len) only when attention weights are being collected
            (``output_attentions=True``), else None. Without gradients they are rebuilt from
            the kernel's lse; when autograd tracks the inputs, output and weights both come
            from the reference attention, so the weights carry the true gradient.

    Raises:
        ModelError: a ``softcap`` is asked (neither this kernel nor sdpa has one), or the
            mask is not a tensor (a flex-attention block mask).
    """
    if kwargs.get("softcap") is not None:
        raise ModelError("selfattn's attention has no logit softcap: load this model with attn_implementation='eager'")
    if attention_mask is not None and not isinstance(attention_mask, torch.Tensor):
        raise ModelError(f"selfattn's attention takes a tensor mask, got {type(attention_mask).__name__}")
    q_len, kv_len = query.shape[-2], key.shape[-2]
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    causal = bool(q_len > 1 and attention_mask is None and causal)  # as transformers' sdpa path decides
    mask = attention_mask
    if mask is not None and mask.shape[-1] > kv_len:  # a mask sized for a longer cache than was filled
        mask = mask[..., :kv_len]
    if mask is not None and mask.is_floating_point() and mask.dtype not in (torch.float32, query.dtype):
        mask = mask.to(query.dtype)
    if kwargs.get("position_bias") is not None:
        mask, causal = biased_mask(kwargs["position_bias"], mask, causal, q_len, kv_len), False
    gqa = key.shape[-3] != query.shape[-3]
    wants_weights = weights_requested(module, kwargs)
    options = {"attn_mask": mask, "is_causal": causal, "scale": scaling, "enable_gqa": gqa}
    tracked = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad)
    p = dropout if getattr(module, "training", False) else 0.0
    lse = None
    if wants_weights and (tracked or p > 0):
        output, weights = attention_forward(query, key, value, dropout_p=p, need_weights=True, **options)
    else:
        output, lse = flash_attention(query, key, value, return_lse=True, dropout_p=p, **options)
        weights = attention_probs_from_lse(query, key, lse, **options) if wants_weights else None
    record_call(module, query, key, value, lse, options)  # nothing unless a recording of this model is open
    return output.transpose(1, 2).contiguous(), weights  # (B, Hq, q_len, d_v) -> (B, q_len, Hq, d_v)


def weights_requested(module: torch.nn.Module, kwargs: dict) -> bool:
    """Whether transformers wants this call's attention weights.

    Most layers pass ``output_attentions`` on in kwargs; some models drop it on the way
    (GPT-2 pops it), and then the only sign is transformers' output collector, which lists
    "attentions" while a forward records them. The config's ``output_attentions`` is last.
    """
    if "output_attentions" in kwargs:
        return bool(kwargs["output_attentions"])
    capturing = sys.modules.get("transformers.utils.output_capturing")
    collector = getattr(capturing, "_active_collector", None)
    if collector is not None:
        collected = collector.get()
        if collected is not None:
            return "attentions" in collected or "cross_attentions" in collected
    return bool(getattr(getattr(module, "config", None), "output_attentions", False))


def biased_mask(position_bias: torch.Tensor, mask: torch.Tensor | None, causal: bool, q_len: int, kv_len: int):
    """position_bias + the mask as one float mask (-inf where hidden).   (B or 1, H or 1, q_len, kv_len)

    Bool masks and the causal rule become 0 / -inf; a float mask is added as it is.
    """
    if mask is None and causal:
        mask = causal_mask(q_len, kv_len, align="top_left", device=position_bias.device)  # (q_len, kv_len)
    if mask is None:
        return position_bias
    return position_bias + to_additive(mask, position_bias.dtype)
