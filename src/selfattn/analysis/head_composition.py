"""Composition scores (Elhage et al. 2021): how much a later head can read what an earlier head writes, from the weights alone.

Head h writes into the residual stream through its OV circuit and reads it through its QK
circuit (row vectors, x W):

    OV_h = W_V,g(h) W_O,h      (d x d)     what h writes, given what it attends to
    QK_h = W_Q,h W_K,g(h)^T    (d x d)     what h's scores compare

A head h2 in a later layer can use h1's output in its queries, its keys or its values:

    Q-composition   |OV_h1 QK_h2|   / (|OV_h1| |QK_h2|)
    K-composition   |OV_h1 QK_h2^T| / (|OV_h1| |QK_h2|)
    V-composition   |OV_h1 OV_h2|   / (|OV_h1| |OV_h2|)

|.| the Frobenius norm. A score near the baseline (the same products of random Gaussian
matrices of the same shapes) says the two circuits barely touch. The norms' gains are
folded into the weights (each layer's input norm into W_Q, W_K, W_V; a post-attention
norm into W_O; per-head q/k norms into W_Q, W_K); the division by each vector's size,
the score scale and RoPE are left out, as in the paper. With grouped key/value heads, h
reads key/value head g(h) = h // (H / Hkv).

The norms are worked out small: |U M V| = |R_U M R_V^T| with U = Q_U R_U and V^T = Q_V R_V
(QR factors), so no d x d matrix of a pair is ever made: one writer layer's R_V W_O against
every later layer's U R_W^T is one matrix product.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from selfattn.analysis.hooks import model_blocks
from selfattn.attention.norm_and_mlp import RMSNorm
from selfattn.errors import ModelError, OptionError

MODES = ("q", "k", "v")
BASELINE_SAMPLES = 16  # random heads on each side: 256 pairs averaged for each mode's baseline
BASELINE_SEED = 0


@dataclass(frozen=True)
class Composition:
    """Every pair of heads' composition scores (``composition_scores``).

    Attributes:
        q: (n_layers, n_heads, n_layers, n_heads) float64: [l1, h1, l2, h2] is how much head
            (l2, h2) reads head (l1, h1)'s output in its queries; NaN unless l1 < l2.
        k: the same for its keys.
        v: the same for its values.
        baseline: mode -> the mean score of random matrices of the same shapes.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    baseline: dict[str, float]

    def strongest(self, mode: str, count: int = 10) -> list[tuple[int, int, int, int, float]]:
        """The ``count`` highest scores of one mode: (writer layer, head, reader layer, head, score), highest first.

        Args:
            mode: "q", "k" or "v".
            count: how many pairs.

        Returns:
            The pairs, highest score first.

        Raises:
            OptionError: an unknown mode.
        """
        if mode not in MODES:
            raise OptionError(f"unknown composition {mode!r}: choose one of {', '.join(MODES)}")
        scores = getattr(self, mode)
        flat = torch.nan_to_num(scores, nan=-1.0).flatten()
        order = flat.argsort(descending=True)[:count]
        found = []
        for index in order.tolist():
            l1, h1, l2, h2 = torch.unravel_index(torch.tensor(index), scores.shape)
            if float(flat[index]) < 0:
                break
            found.append((int(l1), int(h1), int(l2), int(h2), float(flat[index])))
        return found


def _gain(norm) -> torch.Tensor | None:
    """A norm's effective gain vector (RMSNorm's g = w or 1 + w, LayerNorm's weight), or None."""
    if norm is None:
        return None
    if isinstance(norm, RMSNorm):
        return norm.weight.double() + (1.0 if norm.gain == "1+w" else 0.0)
    weight = getattr(norm, "weight", None)
    return None if weight is None else weight.double()


def head_circuits(block) -> dict[str, torch.Tensor]:
    """A layer's heads as factors, norms' gains folded in.   -> {"q", "k", "v": (H, d, d_head), "o": (H, d_head, d)}"""
    attention, c = block.attention, block.attention.config
    group = c.n_heads // c.n_kv_heads
    read = _gain(block.norm1) if block.config.norm_first else None  # the stream is normalised before it is read
    factors = {}
    for name, linear, heads in (("q", attention.w_q, c.n_heads), ("k", attention.w_k, c.n_kv_heads),
                                ("v", attention.w_v, c.n_kv_heads)):
        w = linear.weight.double().view(heads, c.d_head, -1).transpose(1, 2)  # (heads, d, d_head): x W
        if read is not None:
            w = read[None, :, None] * w
        per_head = _gain(attention.q_norm if name == "q" else attention.k_norm if name == "k" else None)
        if per_head is not None:
            w = w * per_head[None, None, :]
        factors[name] = w if name == "q" else w.repeat_interleave(group, dim=0)  # (H, d, d_head)
    w_o = attention.w_o.weight.double().view(c.d_model, c.n_heads, c.d_head).permute(1, 2, 0)  # (H, d_head, d)
    post = _gain(block.post_attention_norm)
    factors["o"] = w_o if post is None else w_o * post[None, None, :]
    return factors


def _r(u: torch.Tensor) -> torch.Tensor:
    """R of u = Q R: (..., d, d_head) -> (..., d_head, d_head); |u M| = |R M| for any M."""
    return torch.linalg.qr(u, mode="r").R


def _sides(circuits: dict) -> tuple[torch.Tensor, torch.Tensor, dict, dict]:
    """One layer's writer side and reader sides, small.

    Returns:
        (A, |OV|, B, |right|): A = R_V W_O (H, d_head, d), so that |OV_h1 X| = |A_h1 X|;
        for each mode B = U R_W^T (H, d, d_head), so that |X U W^T| = |X B| for the reader's
        U W^T (QK for q, QK^T for k, OV for v); and each side's own norm (H,).
    """
    r_v, r_o = _r(circuits["v"]), _r(circuits["o"].transpose(1, 2))
    writer = r_v @ circuits["o"]  # (H, d_head, d)
    ov_norm = torch.linalg.matrix_norm(r_v @ r_o.transpose(1, 2))  # (H,)
    pairs = {"q": (circuits["q"], circuits["k"]), "k": (circuits["k"], circuits["q"]),
             "v": (circuits["v"], circuits["o"].transpose(1, 2))}
    readers, norms = {}, {}
    for mode, (u, w) in pairs.items():
        r_w = _r(w)
        readers[mode] = u @ r_w.transpose(1, 2)  # (H, d, d_head)
        norms[mode] = torch.linalg.matrix_norm(_r(u) @ r_w.transpose(1, 2))  # (H,)
    return writer, ov_norm, readers, norms


def _scores_against(writer: torch.Tensor, ov_norm: torch.Tensor, readers: list[dict], norms: list[dict]) -> dict:
    """One writer layer against later layers, every mode in one product.   -> mode -> (H1, later layers, H2)"""
    h1, dh, d = writer.shape
    blocks = [r[mode] for r in readers for mode in MODES]  # each (H2, d, d_head)
    right = torch.cat([b.permute(1, 0, 2).reshape(d, -1) for b in blocks], dim=1)  # (d, n * H2 * d_head)
    product = (writer.reshape(h1 * dh, d) @ right).view(h1, dh, len(readers), len(MODES), -1, dh)
    size = product.pow(2).sum(dim=(1, 5)).sqrt()  # (H1, later, modes, H2)
    found = {}
    for m, mode in enumerate(MODES):
        right_norm = torch.stack([n[mode] for n in norms])  # (later, H2)
        found[mode] = size[:, :, m] / (ov_norm[:, None, None] * right_norm[None])
    return found


def _scores(left: dict, right: dict, mode: str) -> torch.Tensor:
    """Scores of every head of one layer (writers) against every head of another (readers). -> (H1, H2)"""
    writer, ov_norm, _, _ = _sides(left)
    _, _, readers, norms = _sides(right)
    return _scores_against(writer, ov_norm, [readers], [norms])[mode][:, 0]


def composition_scores(model) -> Composition:
    """Q-, K- and V-composition scores of every pair of heads in different layers, and their random baselines.

    Args:
        model: one of selfattn's models with the same number of heads in every layer.

    Returns:
        A ``Composition``: q, k, v (n_layers, n_heads, n_layers, n_heads), NaN unless the
            writer's layer comes first; ``baseline`` per mode; ``strongest(mode)``.

    Raises:
        ModelError: not a model of selfattn's, fewer than two layers, or layers with
            different numbers of heads.

    Examples:
        >>> import selfattn as sa
        >>> found = sa.composition_scores(sa.load_pretrained("tiny-induction"))
        >>> found.k.shape
        torch.Size([2, 4, 2, 4])
        >>> found.strongest("k", 1)[0][:4]  # a previous-token head into an induction head
        (0, 3, 1, 2)
    """
    blocks = model_blocks(model)
    if len(blocks) < 2:
        raise ModelError("composition needs two layers at least: a head reads what earlier layers wrote")
    heads = blocks[0].attention.config.n_heads
    if any(b.attention.config.n_heads != heads for b in blocks):
        raise ModelError("composition scores fill one layers x heads grid: every layer needs the same number of heads")
    with torch.no_grad():
        circuits = [head_circuits(b) for b in blocks]
        sides = [_sides({n: t.float() for n, t in c.items()}) for c in circuits]  # float32: the products are d^3 each
        layers = len(blocks)
        found = {m: torch.full((layers, heads, layers, heads), float("nan"), dtype=torch.float64) for m in MODES}
        for l1 in range(layers - 1):
            later = sides[l1 + 1:]
            scores = _scores_against(sides[l1][0], sides[l1][1], [s[2] for s in later], [s[3] for s in later])
            for mode in MODES:
                found[mode][l1, :, l1 + 1:, :] = scores[mode].double()
        baseline = random_baseline(circuits[0])
    return Composition(found["q"], found["k"], found["v"], baseline)


def random_baseline(like: dict) -> dict[str, float]:
    """Each mode's mean score between random Gaussian factors of the shapes in ``like`` (seeded: the same every run)."""
    generator = torch.Generator().manual_seed(BASELINE_SEED)
    shapes = {name: (BASELINE_SAMPLES, *tensor.shape[1:]) for name, tensor in like.items()}
    draw = lambda: {n: torch.randn(s, generator=generator, dtype=torch.float64) for n, s in shapes.items()}  # noqa: E731
    left, right = draw(), draw()
    return {mode: float(_scores(left, right, mode).mean()) for mode in MODES}
