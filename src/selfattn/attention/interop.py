"""The boundary with ``torch.nn.MultiheadAttention``: its weights, its masks, its interface.

torch and selfattn disagree on two conventions, and this module is the one place that
translates them:

    masks   torch: bool True = may NOT attend;  ours: bool True = may attend (as SDPA)
            float masks are added to the scores in both
    axes    torch (batch_first=False): (seq, batch, E);  ours: (batch, seq, E)

Weights map one to one: W_q, W_k, W_v are the three row blocks of torch's packed
``in_proj_weight`` (3E, E) (or its separate ``q/k/v_proj_weight`` when kdim/vdim differ
from E), and W_o is ``out_proj``. The attention itself is always ours.

One difference remains: a query row that may see no key at all gets zero weights and a
zero output here, where torch gives NaN.
"""

from __future__ import annotations

import torch
from torch import nn

from selfattn.attention.modules import MultiHeadAttention
from selfattn.errors import ConfigError, OptionError, ShapeError
from selfattn.masks import combine_masks


def from_torch(mha: nn.MultiheadAttention) -> MultiHeadAttention:
    """Our ``MultiHeadAttention`` holding a copy of torch's weights.   nn.MultiheadAttention -> MultiHeadAttention

    [W_q; W_k; W_v] = in_proj_weight (3E, E) row blocks, b likewise; W_o = out_proj.
    Heads, dropout, bias, kdim/vdim, dtype, device and train/eval mode carry over. The
    tensors are copied, so later changes to ``mha`` do not reach the result. Learned
    extra key/value rows (``add_bias_kv``) and ``add_zero_attn`` have no counterpart
    here and are refused with ``ConfigError``. The result takes our inputs: batch first,
    masks True = may attend (``TorchStyleMultiheadAttention`` keeps torch's interface).

    Args:
        mha: the torch module to copy.

    Returns:
        A new ``MultiHeadAttention`` that computes what ``mha`` computes.

    Raises:
        ConfigError: mha is not an ``nn.MultiheadAttention``, or it was built with
            add_bias_kv=True or add_zero_attn=True.

    Examples:
        >>> import selfattn as sa
        >>> import torch
        >>> theirs = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()
        >>> ours = sa.from_torch(theirs)
        >>> x = torch.randn(2, 5, 8)
        >>> hidden = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])  # torch: True = padding
        >>> expected, _ = theirs(x, x, x, key_padding_mask=hidden)
        >>> torch.allclose(ours(x, attn_mask=sa.padding_mask([5, 3])), expected, atol=1e-5)
        True
    """
    return MultiHeadAttention.from_torch(mha)


def torch_masks_to_ours(
    attn_mask: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
    *,
    batch: int,
    n_heads: int,
    q_len: int,
    kv_len: int,
    dtype: torch.dtype,
) -> torch.Tensor | None:
    """torch's two masks as one mask in our convention.   -> (1|batch, 1|H, q_len, kv_len) or None

    attn_mask: (q_len, kv_len) or (batch * H, q_len, kv_len), row b * H + h for head h of
    item b; bool True = hidden (we invert it), float = added (kept). key_padding_mask:
    (batch, kv_len), bool True = padding (inverted) or float (added), spread over heads
    and query rows. Both bool: their logical and. Otherwise bool becomes 0 / -inf and
    the masks are summed in ``dtype``.

    Args:
        attn_mask: torch's attention mask, (q_len, kv_len) or (batch * n_heads, q_len,
            kv_len); bool True = may NOT attend, or float (added). None: none.
        key_padding_mask: torch's padding mask, (batch, kv_len); bool True = padding, or
            float (added). None: none.
        batch: batch size N of the attention call.
        n_heads: number of heads H.
        q_len: number of queries L.
        kv_len: number of keys S.
        dtype: the float dtype that float masks are converted to and summed in.

    Returns:
        One mask in our convention (bool True = may attend, or float added), broadcastable
            as (1 or batch, 1 or H, q_len, kv_len); None when both masks are None.

    Raises:
        ShapeError: a mask is not a tensor, is neither bool nor floating point, or has a
            shape other than those above.

    Examples:
        >>> import selfattn as sa
        >>> import torch
        >>> padding = torch.tensor([[False, False, True]])  # torch: True = padding
        >>> mask = sa.torch_masks_to_ours(None, padding, batch=1, n_heads=2, q_len=2, kv_len=3, dtype=torch.float32)
        >>> tuple(mask.shape), mask.int().tolist()
        ((1, 1, 1, 3), [[[[1, 1, 0]]]])
    """
    ours_attn = ours_padding = None
    if attn_mask is not None:
        _check_mask_dtype(attn_mask, "attn_mask")
        if tuple(attn_mask.shape) == (q_len, kv_len):
            ours_attn = attn_mask[None, None]  # (q_len, kv_len) -> (1, 1, q_len, kv_len)
        elif tuple(attn_mask.shape) == (batch * n_heads, q_len, kv_len):
            ours_attn = attn_mask.view(batch, n_heads, q_len, kv_len)  # (batch * H, q, kv) -> (batch, H, q, kv)
        else:
            raise ShapeError(
                f"attn_mask must be (q_len, kv_len) = {(q_len, kv_len)} or (batch * num_heads, q_len, kv_len) = "
                f"{(batch * n_heads, q_len, kv_len)}, got {tuple(attn_mask.shape)}"
            )
        ours_attn = ~ours_attn if ours_attn.dtype == torch.bool else ours_attn.to(dtype)
    if key_padding_mask is not None:
        _check_mask_dtype(key_padding_mask, "key_padding_mask")
        if tuple(key_padding_mask.shape) != (batch, kv_len):
            raise ShapeError(
                f"key_padding_mask must be (batch, kv_len) = {(batch, kv_len)}, got {tuple(key_padding_mask.shape)}"
            )
        ours_padding = key_padding_mask[:, None, None, :]  # (batch, kv_len) -> (batch, 1, 1, kv_len)
        ours_padding = ~ours_padding if ours_padding.dtype == torch.bool else ours_padding.to(dtype)
    return combine_masks(ours_attn, ours_padding, dtype=dtype)


def _check_mask_dtype(mask, name: str) -> None:
    if not isinstance(mask, torch.Tensor):
        raise ShapeError(f"{name} must be a tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise ShapeError(f"{name} must be bool (torch: True = hidden) or float (added), got {mask.dtype}")


class TorchStyleMultiheadAttention(nn.Module):
    """Our ``MultiHeadAttention`` behind ``torch.nn.MultiheadAttention``'s call signature.

    (L, N, E), (S, N, kdim), (S, N, vdim) -> (L, N, E), weights  [batch_first=False]
    (N, L, E), (N, S, kdim), (N, S, vdim) -> (N, L, E), weights  [batch_first=True]
    (L, E), (S, kdim), (S, vdim) -> (L, E), weights               [unbatched]
    Masks follow torch's conventions and are translated by ``torch_masks_to_ours``.
    ``embed_dim``, ``num_heads``, ``head_dim``, ``kdim`` and ``vdim`` are read from
    ``inner``, as torch's attributes of those names.

    Args:
        inner: the module that does the work (its weights are used, not copied); plain
            multi-head attention only: no grouped-query heads, no RoPE or ALiBi.
        batch_first: whether batched inputs are (N, L, E) instead of torch's default
            (L, N, E).

    Raises:
        ConfigError: inner is not a ``MultiHeadAttention``, or it has grouped-query heads
            or positional "rope" / "alibi".
    """

    def __init__(self, inner: MultiHeadAttention, batch_first: bool = False) -> None:
        """Wrap ``inner``; the class docstring describes the arguments."""
        super().__init__()
        if not isinstance(inner, MultiHeadAttention):
            raise ConfigError(f"inner must be a selfattn MultiHeadAttention, got {type(inner).__name__}")
        if inner.config.n_kv_heads != inner.config.n_heads or inner.config.positional in ("rope", "alibi"):
            raise ConfigError("torch's interface has no grouped-query heads or in-attention positions; use a plain MultiHeadAttention")
        self.inner = inner
        self.batch_first = bool(batch_first)
        self.embed_dim = inner.config.d_model
        self.num_heads = inner.config.n_heads
        self.head_dim = inner.config.d_head
        self.kdim = inner.w_k.in_features
        self.vdim = inner.w_v.in_features

    @classmethod
    def from_torch(cls, mha: nn.MultiheadAttention) -> TorchStyleMultiheadAttention:
        """A drop-in for ``mha``: its weights copied (see ``from_torch``), its batch_first kept.

        Args:
            mha: the torch module to replace.

        Returns:
            A ``TorchStyleMultiheadAttention`` with mha's weights, settings and batch_first.

        Raises:
            ConfigError: mha is not an ``nn.MultiheadAttention``, or it uses add_bias_kv or
                add_zero_attn.
        """
        return cls(from_torch(mha), batch_first=mha.batch_first)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        attn_mask: torch.Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(Y, A): Y as the query's layout; A (N, L, S) averaged over heads, (N, H, L, S) if not, None if not needed.

        ``is_causal`` is only torch's promise that ``attn_mask`` is already causal: the
        mask given is always the one applied, so a truthful hint changes nothing. As in
        torch, is_causal=True without an attn_mask is refused (``OptionError`` here).

        Args:
            query: (L, N, E), or (N, L, E) with batch_first, or (L, E) unbatched.
            key: (S, N, kdim), (N, S, kdim) or (S, kdim), the layout of query.
            value: (S, N, vdim), (N, S, vdim) or (S, vdim), the layout of query.
            key_padding_mask: torch's (N, S) mask, or (S,) unbatched; bool True = padding,
                or float (added). None: none.
            need_weights: return the attention weights as the second element (default True).
            attn_mask: torch's (L, S) or (N * H, L, S) mask; bool True = may NOT attend, or
                float (added). None: none.
            average_attn_weights: average the weights over the heads (default True).
            is_causal: torch's hint that attn_mask is causal; it needs attn_mask.

        Returns:
            The pair (Y, A): Y in the layout of query, (L, N, E), (N, L, E) or (L, E); A
                (N, L, S) averaged, (N, H, L, S) per head, without N for unbatched input, or
                None when need_weights=False.

        Raises:
            OptionError: is_causal=True without attn_mask.
            ShapeError: the inputs are not all 3-D or all 2-D, disagree on batch size or S,
                have the wrong widths, or a mask has the wrong shape or dtype.
        """
        if is_causal and attn_mask is None:
            raise OptionError(
                "is_causal=True is only a hint that attn_mask is causal: pass the mask too, "
                "e.g. torch.nn.Transformer.generate_square_subsequent_mask(L)"
            )
        shapes = f"query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
        if query.dim() not in (2, 3) or not (query.dim() == key.dim() == value.dim()):
            raise ShapeError(f"query, key and value must all be 3-D (batched) or all 2-D (unbatched): {shapes}")
        unbatched = query.dim() == 2
        if unbatched:
            query, key, value = query[None], key[None], value[None]  # (seq, E) -> (1, seq, E)
            if key_padding_mask is not None and key_padding_mask.dim() == 1:
                key_padding_mask = key_padding_mask[None]  # (S,) -> (1, S)
        elif not self.batch_first:
            query, key, value = (x.transpose(0, 1) for x in (query, key, value))  # (seq, N, E) -> (N, seq, E)
        if key.shape[:2] != value.shape[:2] or key.shape[0] != query.shape[0]:
            raise ShapeError(f"query, key and value must share the batch size, and key/value the length: {shapes}")
        batch, q_len, kv_len = query.shape[0], query.shape[1], key.shape[1]
        mask = torch_masks_to_ours(
            attn_mask, key_padding_mask, batch=batch, n_heads=self.num_heads, q_len=q_len, kv_len=kv_len, dtype=query.dtype
        )  # (1|N, 1|H, L, S), True = may attend
        out, weights = self.inner(query, key, value, attn_mask=mask, need_weights=True)  # (N, L, E), (N, H, L, S)
        if not unbatched and not self.batch_first:
            out = out.transpose(0, 1)  # (N, L, E) -> (L, N, E)
        if not need_weights:
            weights = None
        elif average_attn_weights:
            weights = weights.mean(dim=1)  # (N, H, L, S) -> (N, L, S)
        if unbatched:
            out = out[0]  # (1, L, E) -> (L, E)
            weights = None if weights is None else weights[0]  # -> (L, S) or (H, L, S)
        return out, weights
