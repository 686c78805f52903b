"""A plain-torch GPT-2 of the usual shape, the peer that bench/train.py times our model against.

What small GPT trainers usually write (nanoGPT's model is the best-known one), in our own
words and with nothing of selfattn inside:

    X0     = E_tok[ids] + E_pos[0 .. seq-1]                                   (batch, seq, d)
    X_l    = X + Attn(LN1(X)),  then X + MLP(LN2(X))        pre-LN, LayerNorm with a bias
    Attn   = one fused Linear d -> 3d (q, k, v), F.scaled_dot_product_attention(is_causal=True),
             an output Linear d -> d
    MLP    = Linear d -> 4d, GELU (tanh form), Linear 4d -> d
    logits = LN_f(X_L) E_tok^T                                   the output matrix is tied

Every Linear has a bias. ``copy_from_ours`` loads the weights of one of our GPT-2
``DecoderModel``s (``selfattn.training.gpt``), so both start from the same numbers.

    peer = PeerGPT.like(ours.config); copy_from_ours(peer, ours); peer(ids)  # (batch, seq, vocab)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention through torch's fused kernel.   (batch, seq, d) -> (batch, seq, d)"""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=-1)  # (batch, seq, d) each
        q, k, v = (t.view(batch, seq, self.heads, -1).transpose(1, 2) for t in (q, k, v))  # (batch, H, seq, d_head)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (batch, H, seq, d_head)
        return self.out(y.transpose(1, 2).reshape(batch, seq, width))  # (batch, seq, d)


class Block(nn.Module):
    """x + Attn(LN1(x)), then x + MLP(LN2(x)).   (batch, seq, d) -> (batch, seq, d)"""

    def __init__(self, width: int, heads: int, eps: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width, eps=eps)
        self.attn = CausalSelfAttention(width, heads)
        self.ln2 = nn.LayerNorm(width, eps=eps)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.down(F.gelu(self.up(self.ln2(x)), approximate="tanh"))  # (batch, seq, 4d) inside


class PeerGPT(nn.Module):
    """ids (batch, seq) -> logits (batch, seq, vocab): the GPT-2 of the module docstring.

    Args:
        vocab: the vocabulary size.
        context: the learned positions.
        layers, heads, width: the sizes.
        eps: every LayerNorm's epsilon.
    """

    def __init__(self, vocab: int, context: int, layers: int, heads: int, width: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads, eps) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width, eps=eps)

    @classmethod
    def like(cls, config) -> PeerGPT:
        """A peer of the sizes of one of our GPT-2 ``DecoderConfig``s (weights still to copy)."""
        if config.d_ff != 4 * config.d_model or config.n_kv_heads != config.n_heads or not config.tie_embeddings:
            raise ValueError("the peer is plain GPT-2: d_ff = 4 d_model, no grouped-query heads, tied embeddings")
        return cls(config.vocab_size, config.max_positions, config.n_layers, config.n_heads, config.d_model, config.norm_eps)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        seq = ids.shape[1]
        x = self.tokens(ids) + self.positions(torch.arange(seq, device=ids.device))  # (batch, seq, d)
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.tokens.weight.T  # (batch, seq, d) @ (d, vocab) -> (batch, seq, vocab)


def weight_table(layers: int) -> dict[str, list[str]]:
    """{peer name: the names of our model's tensors it is made of} (several are stacked into the fused qkv)."""
    table = {"tokens.weight": ["embed.weight"], "positions.weight": ["position.weight"],
             "ln_f.weight": ["norm.weight"], "ln_f.bias": ["norm.bias"]}
    for i in range(layers):
        ours, peer = f"layers.{i}.", f"blocks.{i}."
        for kind in ("weight", "bias"):
            table[f"{peer}attn.qkv.{kind}"] = [f"{ours}attention.w_{n}.{kind}" for n in "qkv"]
            table[f"{peer}attn.out.{kind}"] = [f"{ours}attention.w_o.{kind}"]
            table[f"{peer}ln1.{kind}"] = [f"{ours}norm1.{kind}"]
            table[f"{peer}ln2.{kind}"] = [f"{ours}norm2.{kind}"]
            table[f"{peer}up.{kind}"] = [f"{ours}feed_forward.linear1.{kind}"]
            table[f"{peer}down.{kind}"] = [f"{ours}feed_forward.linear2.{kind}"]
    return table


def copy_from_ours(peer: PeerGPT, ours: nn.Module) -> None:
    """Load our GPT-2 ``DecoderModel``'s weights into ``peer``, every tensor accounted for."""
    theirs = dict(ours.named_parameters())
    table = weight_table(len(peer.blocks))
    used = {name for names in table.values() for name in names}
    assert used == set(theirs), f"names not mapped: {sorted(set(theirs) ^ used)}"
    state = peer.state_dict()
    assert set(table) == set(state), f"peer names not filled: {sorted(set(state) ^ set(table))}"
    with torch.no_grad():
        for name, sources in table.items():
            value = torch.cat([theirs[s] for s in sources])  # W_q, W_k, W_v stacked on the output axis
            assert value.shape == state[name].shape, f"{name}: {tuple(value.shape)} vs {tuple(state[name].shape)}"
            state[name].copy_(value)
