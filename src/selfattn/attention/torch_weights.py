"""torch.nn.MultiheadAttention's weights in our MultiHeadAttention: the settings and the copy.

Below both ``modules.py`` and ``interop.py``: ``MultiHeadAttention.from_torch`` and
``interop.from_torch`` build the module from ``torch_settings`` and fill it with
``copy_torch_weights``, so neither module imports the other.

[W_q; W_k; W_v] = in_proj_weight (3E, E) row blocks (or ``q/k/v_proj_weight`` when kdim
or vdim differ from E), b likewise; W_o = out_proj.
"""

from __future__ import annotations

import torch
from torch import nn

from selfattn.errors import ConfigError


def torch_settings(mha: nn.MultiheadAttention) -> dict:
    """The constructor arguments of our module for ``mha``: d_model, n_heads, bias, dropout, kdim, vdim.

    Args:
        mha: the torch module to copy.

    Returns:
        Keyword arguments for ``MultiHeadAttention``.

    Raises:
        ConfigError: mha is not an ``nn.MultiheadAttention``, or it was built with
            add_bias_kv=True or add_zero_attn=True.
    """
    if not isinstance(mha, nn.MultiheadAttention):
        raise ConfigError(f"from_torch expects a torch.nn.MultiheadAttention, got {type(mha).__name__}")
    if mha.bias_k is not None or mha.bias_v is not None:
        raise ConfigError("add_bias_kv=True is not supported: our attention has no learned extra key/value row")
    if mha.add_zero_attn:
        raise ConfigError("add_zero_attn=True is not supported: our attention adds no zero key/value row")
    e = mha.embed_dim
    return dict(
        d_model=e,
        n_heads=mha.num_heads,
        bias=mha.in_proj_bias is not None,
        dropout=float(mha.dropout),
        kdim=None if mha.kdim == e else mha.kdim,
        vdim=None if mha.vdim == e else mha.vdim,
    )


def copy_torch_weights(ours: nn.Module, mha: nn.MultiheadAttention) -> nn.Module:
    """Copy ``mha``'s weights, dtype, device and train/eval mode into ``ours`` (built from ``torch_settings``).

    Args:
        ours: a ``MultiHeadAttention`` with ``torch_settings(mha)``.
        mha: the torch module to copy.

    Returns:
        ``ours``, holding copies (not views) of mha's tensors.
    """
    if mha._qkv_same_embed_dim:
        w_q, w_k, w_v = mha.in_proj_weight.chunk(3)  # (3E, E) -> 3 x (E, E)
    else:
        w_q, w_k, w_v = mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight  # (E, E), (E, kdim), (E, vdim)
    ours.to(device=mha.out_proj.weight.device, dtype=mha.out_proj.weight.dtype)
    pairs = [(ours.w_q.weight, w_q), (ours.w_k.weight, w_k), (ours.w_v.weight, w_v), (ours.w_o.weight, mha.out_proj.weight)]
    if mha.in_proj_bias is not None:
        b_q, b_k, b_v = mha.in_proj_bias.chunk(3)  # (3E,) -> 3 x (E,)
        pairs += [(ours.w_q.bias, b_q), (ours.w_k.bias, b_k), (ours.w_v.bias, b_v), (ours.w_o.bias, mha.out_proj.bias)]
    with torch.no_grad():
        for target, source in pairs:
            assert target.shape == source.shape, (tuple(target.shape), tuple(source.shape))
            target.copy_(source)  # a copy into our own storage, not a shared view
            target.requires_grad_(source.requires_grad)
    ours.train(mha.training)
    return ours
