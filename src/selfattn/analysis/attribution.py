"""Direct logit attribution: how much each head (and each other part) writes the target's logit.

In a pre-norm decoder the residual stream at the last layer is a sum of what each part wrote:

    x_L = e + sum_l (a_l + m_l),    a_l = sum_h z_h W_o,h + b_o       (at one position, (d,) each)

e the embeddings, a_l layer l's attention (each head h's part z_h W_o,h, and the bias),
m_l its feed-forward network. The logit of token t is

    logit_t = Norm(x_L) . W_U[t]

and Norm is linear once its scale is frozen at the value it had in the run: RMSNorm(x) =
x * (g / rms(x_L)), LayerNorm(x) = (x - mean(x)) * (g / std(x_L)) + b. With the scale
frozen, every part c gets its share Norm'(c) . W_U[t], and the shares add up to the logit
exactly (the LayerNorm's bias b is one more part). Where attention is normalised again
before it is added (Gemma's post-attention norm) that norm's scale is frozen the same way,
so each head's share passes through both.

    attribute(model, text, target, position) -> Attribution
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from selfattn.analysis.hooks import capture, model_blocks
from selfattn.analysis.next_token import target_id
from selfattn.analysis.stream import attention_parts, frozen_norm
from selfattn.attention.points import point_name
from selfattn.errors import ModelError, OptionError, SentenceError


@dataclass(frozen=True)
class Attribution:
    """Each part's share of one logit (``attribute``).

    Attributes:
        target: the target token's id.
        position: the position whose next-token logit is read, from 0.
        heads: (n_layers, n_heads) float64, each head's share.
        components: (name, share) of every other part, in the order the stream adds them:
            "embeddings", then per layer "attention bias L" (where W_o has a bias) and
            "MLP L", then "final norm bias" (a LayerNorm's).
        logit: the model's own logit for the target at the position.
        ids: the input's token ids.
    """

    target: int
    position: int
    heads: torch.Tensor
    components: tuple[tuple[str, float], ...]
    logit: float
    ids: list[int]

    @property
    def total(self) -> float:
        """The sum of every share: the logit again, up to rounding."""
        return float(self.heads.sum()) + sum(share for _, share in self.components)


def attribute(model, text, target, position: int | None = None) -> Attribution:
    """Direct logit attribution: each head's share of the target's logit, and every other part's.

    share(c) = Norm'(c) . W_U[target], Norm' the final norm with its scale frozen at the
    run's value (see the module docstring); the shares add up to the logit.

    Args:
        model: a pre-norm decoder (``load_pretrained``, ``train``).
        text: one text, or a list of token ids.
        target: an id, or a token as the vocabulary writes it, or a text of one token.
        position: the position whose next-token logit is read, from 0 (default: the last).

    Returns:
        An ``Attribution``: ``heads`` (n_layers, n_heads), ``components``, ``total``, ``logit``.

    Raises:
        ModelError: not a pre-norm decoder of selfattn's.
        SentenceError: the input is not one text.
        OptionError: the target is not one token, or the position is outside the text.

    Examples:
        >>> import selfattn as sa
        >>> model = sa.load_pretrained("tiny-induction")
        >>> found = sa.attribute(model, "kqbxkqb", "x")
        >>> abs(found.total - found.logit) < 1e-4
        True
    """
    blocks = model_blocks(model)
    if not hasattr(model, "generate") or not hasattr(model, "output_matrix"):
        raise ModelError(f"attribution reads a next-token logit: {getattr(model, 'name', type(model).__name__)} "
                         "is not a decoder")
    if not all(block.config.norm_first for block in blocks):
        raise ModelError("attribution splits a pre-norm residual stream: this model normalises after each block")
    encoded = model.tokenize(text)
    if encoded.input_ids.shape[0] != 1:
        raise SentenceError(f"attribution reads one text (or one row of ids), got {encoded.input_ids.shape[0]}")
    n = encoded.input_ids.shape[1]
    if position is None:
        position = n - 1
    if isinstance(position, bool) or not isinstance(position, int) or not 0 <= position < n:
        raise OptionError(f"the position must be a whole number from 0 to {n - 1} (the text has {n} tokens), "
                          f"got {position!r}")
    wanted = target_id(model, target)
    layers = len(blocks)
    names = [point_name(0, "resid_pre")] + [point_name(l, p) for l in range(layers) for p in ("z", "mlp_out")]
    names.append(point_name(layers - 1, "resid_post"))
    with capture(model, names) as seen, torch.no_grad():
        logits = model.run(encoded).logits  # (1, n, vocab)

    def at(name: str) -> torch.Tensor:  # a point's value at the position, float64: (d,), or (H, d_head) for z
        value = seen[name][0]  # (n, d), or (H, n, d_head)
        return (value[:, position] if value.dim() == 3 else value[position]).double()

    final = frozen_norm(model.norm, at(point_name(layers - 1, "resid_post")))
    unembed = model.output_matrix[wanted].double()  # (d,)

    def share(part: torch.Tensor, heads: bool = False) -> torch.Tensor:  # (..., d) -> (...)
        return final.share(part, heads) @ unembed

    components = [("embeddings", float(share(at(point_name(0, "resid_pre")))))]
    heads = torch.zeros(layers, blocks[0].attention.config.n_heads, dtype=torch.float64)
    for l, block in enumerate(blocks):
        z = at(point_name(l, "z"))  # (H, d_head)
        if z.shape[0] != heads.shape[1]:
            raise ModelError("attribution draws one grid of heads: every layer needs the same number of heads")
        parts, bias = attention_parts(block, z)  # (H, d), (d,) or None
        heads[l] = share(parts, heads=True)
        if bias is not None:
            components.append((f"attention bias {l}", float(share(bias))))
        components.append((f"MLP {l}", float(share(at(point_name(l, "mlp_out"))))))
    if final.bias is not None:
        components.append(("final norm bias", float(final.bias @ unembed)))
    return Attribution(wanted, position, heads, tuple(components), float(logits[0, position, wanted]),
                       encoded.input_ids[0].tolist())
