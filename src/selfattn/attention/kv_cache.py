"""A key/value cache for incremental decoding.

When a model generates one token at a time, the keys and values of earlier tokens do not
change (causal attention never lets an old token see a new one), so each layer keeps
them and computes K and V only for the new token. The cache is explicit data that the
caller owns and passes in; modules never keep it on ``self``.
"""

from __future__ import annotations

import torch

from selfattn.errors import ShapeError


class KVCache:
    """Keys and values seen so far by one attention layer: (batch, kv_heads, length, d_head).

    Starts empty and takes no arguments. Pass one to ``MultiHeadAttention`` (``cache=``)
    or one per layer to ``Transformer`` (``Transformer.new_caches``); each call appends
    its new keys and values. ``key`` and ``value`` hold the whole history, or None while
    empty. One cache belongs to one layer and one sequence batch.

    Examples:
        >>> import selfattn as sa
        >>> import torch
        >>> cache = sa.KVCache()
        >>> k, v = cache.append(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))  # a 3-token prompt
        >>> k, v = cache.append(torch.ones(1, 2, 1, 4), torch.ones(1, 2, 1, 4))  # one new token
        >>> cache.length, tuple(k.shape)
        (4, (1, 2, 4, 4))
        >>> cache.reset()
        >>> cache
        KVCache(length=0)
    """

    def __init__(self) -> None:
        self.key: torch.Tensor | None = None
        self.value: torch.Tensor | None = None

    @property
    def length(self) -> int:
        """How many positions are cached; the next token's position."""
        return 0 if self.key is None else int(self.key.shape[-2])

    def append(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K = [K_past; K_new], V = [V_past; V_new].   (batch, Hkv, new, d) -> (batch, Hkv, past + new, d)

        The first call stores the tensors as they are; later calls concatenate along the
        length axis and replace the stored tensors.

        Args:
            key: the new keys, (batch, kv_heads, new, d_head).
            value: the new values, (batch, kv_heads, new, d_v), with the key's length.

        Returns:
            The pair (K, V) of all cached keys and values, (batch, kv_heads, past + new,
                d_head) and (batch, kv_heads, past + new, d_v).

        Raises:
            ShapeError: key or value is not 4-D, they disagree on batch, heads or length,
                or they do not fit the cached tensors (batch, heads, widths, dtype, device).
        """
        if key.dim() != 4 or value.dim() != 4 or key.shape[:-1] != value.shape[:-1]:
            raise ShapeError(
                f"keys and values must be (batch, kv_heads, length, d_head) with the same length: "
                f"key {tuple(key.shape)}, value {tuple(value.shape)}"
            )
        if self.key is None:
            self.key, self.value = key, value
        else:
            if key.shape[:-2] != self.key.shape[:-2] or key.shape[-1] != self.key.shape[-1]:
                raise ShapeError(
                    f"new keys {tuple(key.shape)} do not fit the cached keys {tuple(self.key.shape)} "
                    f"(batch, kv_heads, length, d_head)"
                )
            if value.shape[-1] != self.value.shape[-1]:
                raise ShapeError(f"new values {tuple(value.shape)} do not fit the cached values {tuple(self.value.shape)}")
            if (key.dtype, key.device) != (self.key.dtype, self.key.device):
                raise ShapeError(
                    f"new keys are {key.dtype} on {key.device}, the cache holds {self.key.dtype} on {self.key.device}"
                )
            self.key = torch.cat([self.key, key], dim=-2)  # (batch, Hkv, past + new, d)
            self.value = torch.cat([self.value, value], dim=-2)  # (batch, Hkv, past + new, d_v)
        return self.key, self.value

    def reset(self) -> None:
        """Forget every cached key and value (length becomes 0)."""
        self.key = self.value = None

    def __repr__(self) -> str:
        return f"KVCache(length={self.length})"
