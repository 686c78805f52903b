"""``MultiHeadAttention``: it owns the projection weights, positions and cache, and looks its path up.

    Q = X W_q,  K = X_kv W_k,  V = X_kv W_v          (batch, heads, seq, d_head)
    [Q = RMSNorm(Q), K = RMSNorm(K) over each head's features, with qk_norm (Qwen3, Gemma 3)]
    [Q, K turned by RoPE]
    head_h = softmax(s Q_h K_g(h)^T + mask) V_g(h),   g(h) = h // group,  s = 1 / sqrt(d_head) or the config's scale
    Y = concat(head_0 .. head_(H-1)) W_o              (batch, q_len, d_model)

No module computes scores or softmax itself: ``forward`` runs the first path of
``attention.paths`` that takes the call (flash, packed, reference: one signature, in a
registry), and ``steps`` (tracing) runs ``attention_steps``; all are built from the same
step functions. ``SelfAttention`` (one head, the seed's next step) is in ``self_attention``.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from selfattn.attention.config import AttentionConfig
from selfattn.attention.functional import AttentionSteps, attention_steps
from selfattn.attention.kv_cache import KVCache
from selfattn.attention.norm_and_mlp import RMSNorm
from selfattn.attention.paths import AttentionCall, PathChoice, choose_path, merge_heads
from selfattn.attention.points import LayerPoints, PointCall
from selfattn.attention.torch_weights import copy_torch_weights, torch_settings
from selfattn.checks import check_width, expand_kv_heads
from selfattn.errors import ShapeError
from selfattn.masks import causal_mask, check_mask_kind, combine_masks, sliding_window_mask
from selfattn.positional import alibi_bias, apply_rope
from selfattn.pipeline.steps import context_vectors
from selfattn.positional.rope import RopeRotation, rotate_pairs


class MultiHeadSteps(NamedTuple):
    """The intermediates of one multi-head attention call (for tracing; see ``MultiHeadAttention.steps``)."""

    q: torch.Tensor  # (batch, H, q_len, d_head), after the q norm and RoPE if any
    k: torch.Tensor  # (batch, Hkv, kv_len, d_head), cached keys included
    v: torch.Tensor  # (batch, Hkv, kv_len, d_head)
    mask: torch.Tensor | None  # what was added to / masked out of the scores (bool or float)
    attention: AttentionSteps  # scores, softmax and per-head outputs, heads (batch, H, ...)
    concat: torch.Tensor  # (batch, q_len, H * d_head)
    output: torch.Tensor  # (batch, q_len, d_model): concat W_o
    q_plain: torch.Tensor | None = None  # (batch, H, q_len, d_head) before RoPE (after the q norm); None without RoPE
    k_plain: torch.Tensor | None = None  # (batch, Hkv, new_len, d_head): this call's keys before RoPE


class MultiHeadAttention(nn.Module):
    """Multi-head attention with optional grouped-query / multi-query heads and cross-attention.

    (batch, q_len, d_model) [, (batch, kv_len, kdim), (batch, kv_len, vdim)] -> (batch, q_len, d_model).
    Unbatched (seq, d_model) inputs work too. Dropout acts on the weights in training only.
    The parameters are ``w_q``, ``w_k``, ``w_v`` and ``w_o`` (``nn.Linear``), and with
    config.qk_norm ``q_norm`` and ``k_norm`` (``RMSNorm`` over d_head; else None); the
    settings are kept, validated, as ``config`` (an ``AttentionConfig``).

    Args:
        d_model: width of the query input and of the output.
        n_heads: number of query heads H (default 1).
        n_kv_heads: number of key/value heads; it must divide n_heads. None (default) means
            n_heads; fewer gives grouped-query attention, 1 multi-query attention.
        bias: whether W_q, W_k, W_v and W_o have biases (default True).
        dropout: chance of dropping each attention weight in training, in [0, 1).
        d_head: width of each head; None means d_model // n_heads.
        head_dim: the old name of d_head: still taken, with a DeprecationWarning.
        kdim: width of the key input, for cross-attention; None means d_model.
        vdim: width of the value input, for cross-attention; None means d_model.
        positional: "none" (default), or "rope" (rotate queries and keys by position) or
            "alibi" (add a per-head distance bias); "sinusoidal" and "learned" are accepted
            and do nothing here (a model adds them to its input).
        rope_base: the RoPE frequency base (default 10000).
        attn_impl: "reference" (default) or "flash": the tiled kernel for calls that do
            not ask for the weights.
        config: a ready ``AttentionConfig``; when given, every argument above is ignored.

    Raises:
        ConfigError: the arguments do not make a valid ``AttentionConfig`` (for example
            d_model not divisible by n_heads, or n_heads not divisible by n_kv_heads).

    Examples:
        >>> import selfattn as sa
        >>> import torch
        >>> mha = sa.MultiHeadAttention(d_model=8, n_heads=4, n_kv_heads=2)
        >>> y, weights = mha(torch.randn(2, 5, 8), is_causal=True, need_weights=True)
        >>> tuple(y.shape), tuple(weights.shape)
        ((2, 5, 8), (2, 4, 5, 5))
        >>> bool((weights.triu(diagonal=1) == 0).all())  # no query sees a later key
        True
        >>> cross = sa.MultiHeadAttention(8, 2, kdim=6, vdim=3)
        >>> tuple(cross(torch.randn(2, 4, 8), torch.randn(2, 7, 6), torch.randn(2, 7, 3)).shape)
        (2, 4, 8)
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int = 1,
        n_kv_heads: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        *,
        d_head: int | None = None,
        head_dim: int | None = None,
        kdim: int | None = None,
        vdim: int | None = None,
        positional: str = "none",
        rope_base: float = 10000.0,
        attn_impl: str = "reference",
        config: AttentionConfig | None = None,
    ) -> None:
        """Create the four projections; the class docstring describes the arguments."""
        super().__init__()
        if head_dim is not None:
            warnings.warn("MultiHeadAttention(head_dim=...) is now d_head=...", DeprecationWarning, stacklevel=2)
            d_head = head_dim if d_head is None else d_head
        if config is None:
            config = AttentionConfig(
                d_model, n_heads, n_kv_heads, d_head, bias, dropout, kdim, vdim, positional, rope_base, attn_impl
            )
        self.config = config
        c = config
        self.w_q = nn.Linear(c.d_model, c.n_heads * c.d_head, bias=c.bias)
        self.w_k = nn.Linear(c.kdim or c.d_model, c.n_kv_heads * c.d_head, bias=c.bias)
        self.w_v = nn.Linear(c.vdim or c.d_model, c.n_kv_heads * c.d_head, bias=c.bias)
        self.w_o = nn.Linear(c.n_heads * c.d_head, c.d_model, bias=c.output_bias)
        self.q_norm = RMSNorm(c.d_head, c.norm_eps, c.norm_gain) if c.qk_norm else None
        self.k_norm = RMSNorm(c.d_head, c.norm_eps, c.norm_gain) if c.qk_norm else None
        # The hooks set on this layer's named points (``attention.points``; set by ``selfattn.hooks``
        # for a with-block); None, as almost always, keeps every path exactly as without them.
        self.points: LayerPoints | None = None

    @classmethod
    def from_config(cls, config: AttentionConfig) -> MultiHeadAttention:
        """A new module with freshly initialised weights, built from a configuration.

        Args:
            config: the validated settings (see ``AttentionConfig``).

        Returns:
            The ``MultiHeadAttention`` for ``config``.
        """
        return cls(config.d_model, config=config)

    @classmethod
    def from_torch(cls, mha: nn.Module) -> MultiHeadAttention:
        """A copy of a ``torch.nn.MultiheadAttention``'s weights in our module (see ``attention.interop``).

        Args:
            mha: the torch module to copy.

        Returns:
            A ``MultiHeadAttention`` with the same heads, dropout, bias and weights.

        Raises:
            ConfigError: mha is not an ``nn.MultiheadAttention``, or it uses add_bias_kv or
                add_zero_attn.
        """
        return copy_torch_weights(cls(**torch_settings(mha)), mha)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        *,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        cache: KVCache | None = None,
        need_weights: bool = False,
        positions: torch.Tensor | None = None,
        real_tokens: torch.Tensor | None = None,
    ):
        """Y, or (Y, weights (batch, H, q_len, kv_len)) with need_weights=True (no batch axis if unbatched).

        Y = concat(head_0 .. head_(H-1)) W_o, head_h = softmax(s Q_h K_g(h)^T + mask) V_g(h),
        s = config.score_scale (1 / sqrt(d_head) unless the config gives a scale).

        Args:
            query: (batch, q_len, d_model), or (q_len, d_model) without a batch axis.
            key: (batch, kv_len, kdim); None means query (self-attention).
            value: (batch, kv_len, vdim); None means key.
            attn_mask: None, bool (True = may attend) or float (added to the scores),
                broadcastable to (batch, H, q_len, kv_len); a 3-D mask is read as
                (batch, q_len, kv_len), not as nn.MultiheadAttention's
                (batch * heads, q_len, kv_len) (see ``interop.torch_masks_to_ours``). With a
                cache, kv_len counts the cached keys too. Applied together with is_causal.
            is_causal: hide later keys, aligned bottom-right: the queries are the last q_len
                positions of the keys, so query i sees keys j <= kv_len - q_len + i.
            cache: a ``KVCache`` that this call extends, in place, with its keys (after
                RoPE) and values; attention then covers the cached keys and the new ones.
            need_weights: also return the attention weights (this always takes the
                reference path, also with attn_impl="flash").
            positions: with RoPE, the positions of the q_len new tokens, (q_len,) or
                (batch, q_len) (a left-padded batch counts from each row's first real
                token); the new keys get the same ones. None: kv_len - q_len .. kv_len - 1.
                Or a ``RopeRotation`` (``positional.rope.rope_rotation``): their cos and
                sin computed once, for a model whose every layer turns the same positions.
                Self-attention only.
            real_tokens: (batch, q_len) bool, True at the real tokens of a padded batch (None:
                all real); only the hooks of intervention points read it (``attention.points``).

        Returns:
            Y, (batch, q_len, d_model); with need_weights=True the pair (Y, weights),
                weights (batch, H, q_len, kv_len). Unbatched input gives (q_len, d_model) and
                (H, q_len, kv_len).

        Raises:
            ShapeError: an input is not (batch, seq, width) or (seq, width) with the widths
                above, the inputs disagree on batch axis, batch size or kv_len, the mask
                does not broadcast, or the cache holds keys of another shape.
        """
        call = AttentionCall(query, key, value, attn_mask, is_causal, cache, need_weights, positions, real_tokens)
        path, _ = choose_path(self, call)
        return path.run(self, call)

    def path_for(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        *,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        cache: KVCache | None = None,
        need_weights: bool = False,
        positions: torch.Tensor | None = None,
    ) -> PathChoice:
        """Which attention path ``forward`` takes for these arguments, and why each faster one declined.

        Nothing is computed: the paths (``attention.paths.PATHS``) are asked in the
        module's order (flash first with attn_impl="flash", then the packed training path,
        then the reference path, which takes every call).

        Args:
            query: as in ``forward``.
            key: as in ``forward``.
            value: as in ``forward``.
            attn_mask: as in ``forward``.
            is_causal: as in ``forward``.
            cache: as in ``forward``.
            need_weights: as in ``forward``.
            positions: as in ``forward``.

        Returns:
            ``PathChoice(name, declined)``: the path's name ("flash", "packed" or
                "reference") and, for each path tried before it, the reason it declined.

        Examples:
            >>> import selfattn as sa
            >>> import torch
            >>> mha = sa.MultiHeadAttention(8, 2, attn_impl="flash")
            >>> mha.path_for(torch.randn(1, 4, 8), need_weights=True).declined["flash"]
            'the call asks for the weights (need_weights=True), which the tiled kernel never holds'
        """
        call = AttentionCall(query, key, value, attn_mask, is_causal, cache, need_weights, positions)
        return choose_path(self, call)[1]

    def steps(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        *,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        cache: KVCache | None = None,
        positions: torch.Tensor | None = None,
        real_tokens: torch.Tensor | None = None,
    ) -> MultiHeadSteps:
        """Run attention and return every intermediate (the projections, each head, the concat).

        Always the reference computation (``attention_steps``), whatever attn_impl says.

        Args:
            query: (batch, q_len, d_model), or (q_len, d_model) without a batch axis.
            key: (batch, kv_len, kdim); None means query.
            value: (batch, kv_len, vdim); None means key.
            attn_mask: as in ``forward``.
            is_causal: hide later keys, aligned bottom-right (as in ``forward``).
            cache: a ``KVCache`` to extend with this call's keys and values, in place.
            positions: RoPE's positions of the new tokens, as in ``forward``.
            real_tokens: the real tokens of a padded batch, for the intervention points (as in ``forward``).

        Returns:
            ``MultiHeadSteps(q, k, v, mask, attention, concat, output, q_plain, k_plain)``:
                q (batch, H, q_len, d_head) after the q norm (with qk_norm) and RoPE
                (q_plain and k_plain: after the norm, before RoPE; None without RoPE);
                k, v (batch, Hkv, kv_len, d_head), cached keys
                included; the one mask applied (bool, float or None); the ``AttentionSteps``
                of the heads (batch, H, ...); concat (batch, q_len, H * d_head); output
                (batch, q_len, d_model). For unbatched input only concat and output drop
                the batch axis.

        Raises:
            ShapeError: the inputs, the mask or the cache do not fit (as in ``forward``).
        """
        heads = self.project_heads(query, key, value, attn_mask, is_causal, cache, positions, real_tokens=real_tokens)
        steps = attention_steps(
            heads.q, heads.k, heads.v, attn_mask=heads.mask, dropout_p=self.dropout_p, scale=heads.scale,
            enable_gqa=self.grouped,
        )  # heads: (batch, H, q_len, d_head)
        if heads.call is not None and "pattern" in self.points:
            weights = self.points.apply("pattern", steps.weights, heads.call)  # (batch, H, q_len, kv_len)
            steps = steps._replace(weights=weights, output=self.attend_with(weights, heads.v))
        z, output = self.heads_out(steps.output, heads.call)  # (batch, H, q_len, d_head), (batch, q_len, d_model)
        steps = steps._replace(output=z)
        concat = merge_heads(z)  # (batch, q_len, H * d_head)
        if heads.unbatched:
            output, concat = output[0], concat[0]
        return MultiHeadSteps(heads.q, heads.k, heads.v, heads.mask, steps, concat, output, heads.q_plain, heads.k_plain)

    def causal_alone(self, attn_mask) -> bool:
        """Whether the causal rule would be the only mask: no user mask, no window, no ALiBi bias.

        Args:
            attn_mask: the call's mask, or None.

        Returns:
            True when a causal call needs no mask tensor at all.
        """
        return attn_mask is None and self.config.positional != "alibi" and self.config.sliding_window is None

    @property
    def dropout_p(self) -> float:
        """The dropout on the weights in this mode: the config's in training, 0 in eval."""
        return self.config.dropout if self.training else 0.0

    @property
    def grouped(self) -> bool:
        """Whether key/value heads are fewer than query heads (grouped-query attention)."""
        return self.config.n_kv_heads != self.config.n_heads

    def project_heads(
        self, query, key, value, attn_mask, is_causal: bool, cache: KVCache | None, positions=None, fast: bool = False,
        real_tokens: torch.Tensor | None = None,
    ) -> Heads:
        """Project the inputs into heads, normalise q and k (qk_norm), apply RoPE and the cache, build the one mask.

        What every attention path starts from (``attention.paths``): the module owns the
        projections, the norms, the positions and the cache; a path only attends. With
        ``fast`` (``forward``, not ``steps``) self-attention may take the stacked
        projection, whose queries come out already multiplied by the score scale when no
        q norm follows; ``scale`` then says what is left to apply (1.0).

        Args:
            query: (batch, q_len, d_model) or (q_len, d_model).
            key: (batch, kv_len, kdim); None means query.
            value: (batch, kv_len, vdim); None means key.
            attn_mask: the user's mask, as in ``forward``.
            is_causal: add the causal rule (bottom-right) to the mask.
            cache: a ``KVCache`` to extend with this call's keys and values, in place.
            positions: RoPE's positions of the new tokens, as in ``forward``.
            fast: allow the stacked projection.
            real_tokens: the real tokens of a padded batch, for the intervention points.

        Returns:
            ``Heads(q, k, v, mask, unbatched, scale, q_plain, k_plain, call)``: q (batch, H,
                q_len, d_head) after the norm and RoPE, k and v (batch, Hkv, kv_len,
                d_head) with the cache, the one mask (or None), whether the input had no
                batch axis, the scale left to apply (None: 1 / sqrt(d_head)), q and k
                after the norm and before RoPE, and the ``PointCall`` the layer's points
                are told (None when none is set). With points set, the q, k and v hooks
                have run: k and v before the cache keeps them.

        Raises:
            ShapeError: the inputs, the mask or the cache do not fit (as in ``forward``).
        """
        c = self.config
        key = query if key is None else key
        value = key if value is None else value
        check_width(query, c.d_model, "query")
        check_width(key, self.w_k.in_features, "key")
        check_width(value, self.w_v.in_features, "value")
        shapes = f"query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
        if not query.dim() == key.dim() == value.dim():
            raise ShapeError(f"query, key and value must all be batched (batch, seq, d) or all unbatched (seq, d): {shapes}")
        unbatched = query.dim() == 2
        if unbatched:
            query, key, value = query[None], key[None], value[None]  # (1, seq, d)
        if key.shape[:2] != value.shape[:2] or key.shape[0] != query.shape[0]:
            raise ShapeError(
                f"query, key and value must share the batch size, and key/value the length: {shapes}"
            )

        past = 0 if cache is None else cache.length
        points = self.points
        call = None if points is None else PointCall(real_tokens, past)
        # The stacked projection folds the score scale into Q: not when a hook reads or changes Q.
        q, k, v, scale = self._project(query, key, value, fast and (points is None or "q" not in points))
        q = _split_heads(q, c.n_heads)  # (batch, H, q_len, d_head)
        k = _split_heads(k, c.n_kv_heads)  # (batch, Hkv, new_len, d_head)
        v = _split_heads(v, c.n_kv_heads)  # (batch, Hkv, new_len, d_head)
        if c.qk_norm:  # each head's features, before RoPE (Qwen3, Gemma 3)
            q, k = self.q_norm(q), self.k_norm(k)  # (batch, H or Hkv, seq, d_head)
        if positions is not None and (c.positional != "rope" or key is not query):
            raise ShapeError("positions are RoPE's positions of self-attention's new tokens: give them only with RoPE and no key")
        q_plain, k_plain = (q, k) if c.positional == "rope" else (None, None)
        rotation = positions if isinstance(positions, RopeRotation) else None
        if rotation is not None and rotation.cos.shape[-2] != k.shape[-2]:
            raise ShapeError(
                f"the RoPE rotation is for {rotation.cos.shape[-2]} positions, but this call has {k.shape[-2]} new tokens"
            )
        if rotation is not None:
            # The new queries and keys stand at the same positions: one turn for both (a
            # decoding step of a small model is many small calls, and this saves six).
            turned = rotate_pairs(torch.cat((q, k), dim=-3), rotation.cos, rotation.sin, c.rope_pairs)
            q, k = turned.split((q.shape[-3], k.shape[-3]), dim=-3)  # (batch, H, new, d), (batch, Hkv, new, d)
        elif c.positional == "rope":
            rope = dict(base=c.rope_base, pairs=c.rope_pairs, scaling=c.rope_scaling)
            k = apply_rope(k, torch.arange(past, past + k.shape[-2], device=k.device) if positions is None else positions, **rope)
        if call is not None:
            k, v = points.apply("k", k, call), points.apply("v", v, call)  # (batch, Hkv, new_len, d_head)
        if cache is not None:
            k, v = cache.append(k, v)  # (batch, Hkv, past + new_len, d_head)
        q_len, kv_len = q.shape[-2], k.shape[-2]
        if c.positional == "rope" and rotation is None:
            # The queries are the newest positions: bottom-right aligned with the keys.
            q = apply_rope(q, torch.arange(kv_len - q_len, kv_len, device=q.device) if positions is None else positions, **rope)
        if call is not None:
            q = points.apply("q", q, call)  # (batch, H, q_len, d_head)
        return Heads(q, k, v, self._mask(attn_mask, is_causal, q_len, kv_len, q), unbatched, scale, q_plain, k_plain,
                     call)

    def attend_with(self, weights: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """z_h = A_h V_g(h) for given weights (a pattern a hook changed).

        Args:
            weights: A, (batch, H, q_len, kv_len).
            v: the values, (batch, Hkv, kv_len, d_head).

        Returns:
            z, (batch, H, q_len, d_head).
        """
        _, v = expand_kv_heads(v, v, weights.shape[-3])  # (batch, H, kv_len, d_head)
        return context_vectors(weights, v)

    def heads_out(self, z: torch.Tensor, call: PointCall | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(z, Y): Y = concat(z_0 .. z_(H-1)) W_o (+ b_o), through the z and result points when set.

        Every path ends here. With a result point, each head's part z_h W_o,h is made
        (batch, q_len, H, d_model), handed to the hooks, and Y is their sum plus the bias.

        Args:
            z: each head's output, (batch, H, q_len, d_head).
            call: what the layer's points are told (``Heads.call``); None when none is set.

        Returns:
            (z as the hooks left it, Y (batch, q_len, d_model)).
        """
        if call is not None and "z" in self.points:
            z = self.points.apply("z", z, call)  # (batch, H, q_len, d_head)
        if call is None or "result" not in self.points:
            return z, self.w_o(merge_heads(z))  # (batch, q_len, d_model)
        c = self.config
        w_o = self.w_o.weight.view(c.d_model, c.n_heads, c.d_head)  # (d_model, H, d_head)
        result = torch.einsum("bhqe,dhe->bqhd", z, w_o)  # (batch, q_len, H, d_model)
        result = self.points.apply("result", result, call)
        out = result.sum(dim=-2)  # (batch, q_len, d_model)
        return z, out if self.w_o.bias is None else out + self.w_o.bias

    def _project(self, query, key, value, fast: bool):
        """Q = X W_q, K = X W_k, V = X W_v, and the scale still to apply to Q K^T (None: 1 / sqrt(d_head)).

        (batch, seq, d) -> (batch, seq, H * d_head), (batch, seq, Hkv * d_head) x 2.
        Self-attention in ``forward`` without gradients does the three products as one,
        with the weights stacked [s W_q; W_k; W_v], s the score scale: one larger matrix
        product keeps the CPU busier than three small ones (about 20% faster at 256 tokens
        x 384 wide), and folding s into W_q saves a pass over Q. With a q norm after the
        projection s cannot be folded (the norm would undo it): the stack is [W_q; W_k; W_v]
        and s is left to apply.
        The stack is rebuilt whenever a weight changes (tracked by tensor version and address)
        and after every forward with gradients and every ``train``/``eval``: fused optimisers
        (``AdamW(fused=True)``) update weights in place without bumping their version.
        """
        scale = self.config.scale  # None: the default, 1 / sqrt(d_head)
        if not (fast and query is key is value):
            return self.w_q(query), self.w_k(key), self.w_v(value), scale
        widths = [self.w_q.out_features, self.w_k.out_features, self.w_v.out_features]
        params = [self.w_q.weight, self.w_k.weight, self.w_v.weight]
        if torch.is_grad_enabled() and any(p.requires_grad for p in params):
            # Training: the stack rebuilt on every call, so that the gradients flow back to each weight.
            self.forget_stack()
            weight = torch.cat(params)
            bias = torch.cat([self.w_q.bias, self.w_k.bias, self.w_v.bias]) if self.config.bias else None
        else:
            weight, bias = self._stacked_qkv()
            if self.folds_scale:
                scale = 1.0  # W_q already scaled
        q, k, v = F.linear(query, weight, bias).split(widths, dim=-1)  # (batch, seq, sum of widths) -> 3 views
        return q, k, v, scale

    def train(self, mode: bool = True) -> MultiHeadAttention:
        """``nn.Module.train``; it also drops the stacked inference weights (see ``_project``)."""
        self.forget_stack()
        return super().train(mode)

    @property
    def folds_scale(self) -> bool:
        """Whether the stacked inference weights carry the score scale in W_q (not with a q norm after it)."""
        return not self.config.qk_norm

    def forget_stack(self) -> None:
        """Drop the stacked inference weights; the next call without gradients builds them again."""
        self._qkv_cache = None

    def _stacked_qkv(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        linears = (self.w_q, self.w_k, self.w_v)
        tensors = [t for lin in linears for t in (lin.weight, lin.bias) if t is not None]
        stamp = tuple((t.data_ptr(), t._version, t.dtype) for t in tensors)
        cached = getattr(self, "_qkv_cache", None)
        if cached is None or cached[0] != stamp:
            scale = self.config.score_scale if self.folds_scale else 1.0
            with torch.no_grad():
                weight = torch.cat([self.w_q.weight * scale, self.w_k.weight, self.w_v.weight])  # ((H + 2 Hkv) d_head, d)
                bias = torch.cat([self.w_q.bias * scale, self.w_k.bias, self.w_v.bias]) if self.config.bias else None
            cached = self._qkv_cache = (stamp, weight, bias)
        return cached[1], cached[2]

    def _mask(self, attn_mask, is_causal: bool, q_len: int, kv_len: int, q: torch.Tensor):
        """The user's mask, the causal mask (bottom-right), the window and the ALiBi bias, as one mask."""
        causal = causal_mask(q_len, kv_len, align="bottom_right", device=q.device) if is_causal else None
        if self.config.sliding_window is not None:
            window = sliding_window_mask(q_len, kv_len, left=self.config.sliding_window - 1, right=None,
                                         align="bottom_right", device=q.device)
            causal = window if causal is None else causal & window
        bias = None
        if self.config.positional == "alibi":
            bias = alibi_bias(self.config.n_heads, q_len, kv_len, dtype=q.dtype, device=q.device)  # (H, q_len, kv_len)
        if attn_mask is not None:
            check_mask_kind(attn_mask)
            if isinstance(attn_mask, torch.Tensor) and attn_mask.dim() == 3:
                attn_mask = attn_mask[:, None]  # (batch, q_len, kv_len) -> (batch, 1, q_len, kv_len)
        return combine_masks(attn_mask, causal, bias, dtype=q.dtype)


class Heads(NamedTuple):
    """A call's heads after projection, RoPE and the cache, with its one mask (``project_heads``)."""

    q: torch.Tensor  # (batch, H, q_len, d_head)
    k: torch.Tensor  # (batch, Hkv, kv_len, d_head)
    v: torch.Tensor  # (batch, Hkv, kv_len, d_head)
    mask: torch.Tensor | None
    unbatched: bool
    scale: float | None  # what is left to multiply Q K^T by; None: 1 / sqrt(d_head)
    q_plain: torch.Tensor | None = None  # after the q norm, before RoPE
    k_plain: torch.Tensor | None = None
    call: PointCall | None = None  # what the layer's intervention points are told; None when none is set


def _split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(batch, seq, heads * d_head) -> (batch, heads, seq, d_head)"""
    batch, seq, width = x.shape
    return x.view(batch, seq, n_heads, width // n_heads).transpose(1, 2)  # (batch, heads, seq, d_head)
