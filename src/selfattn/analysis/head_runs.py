"""Every head's scores on one input, and over several: what ``selfattn heads`` hands its tables.

One input gives each head its scores (``decoder_roles`` for a decoder, ``head_roles`` for
an encoder); a file of texts gives each score's mean over the texts and its spread, the
standard deviation over them (n - 1 in the denominator; 0 for a single text), and the role
the mean scores name by the same rule as one input's (``role_of``, ``encoder_role``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import torch

from selfattn.analysis.decoder_roles import DECODER_PATTERNS, INDUCTION, DecoderHeadRole, role_of
from selfattn.analysis.head_roles import PARTS, HeadRole, encoder_role


class DecoderRun(NamedTuple):
    """A decoder on one input: its tokens and every head's scores.

    Attributes:
        ids: the token ids read.
        tokens: as the vocabulary writes them.
        readable: each token decoded on its own.
        roles: one list per layer of one ``DecoderHeadRole`` per head.
        probe_scores: (layers, heads) induction_probe_score on the probe; None on a text.
        ablation_delta: (layers, heads) the loss change when each head alone is zeroed; None unless asked.
        loss: the mean loss over the scored tokens with no head zeroed; None unless asked.
    """

    ids: list[int]
    tokens: list[str]
    readable: list[str]
    roles: list[list[DecoderHeadRole]]
    probe_scores: torch.Tensor | None = None
    ablation_delta: torch.Tensor | None = None
    loss: float | None = None


def probe_roles(roles: list[list[DecoderHeadRole]], probe_scores: torch.Tensor) -> list[list[DecoderHeadRole]]:
    """The roles on the induction probe: induction read from the probe's score, the other patterns as they are.

    Args:
        roles: ``classify_decoder_heads`` on the probe.
        probe_scores: (layers, heads) ``induction_probe_score``.

    Returns:
        The same records with each role by ``role_of`` over the table's numbers: prev,
            dup, first and the probe's induction score.
    """
    named = []
    for layer, row in enumerate(roles):
        named.append([])
        for head, r in enumerate(row):
            scores = dict(r.scores, **{INDUCTION: float(probe_scores[layer, head])})
            named[-1].append(replace(r, role=role_of(scores)))
    return named


def spread(values) -> dict[str, float]:
    """{"mean", "std"} of a list of numbers: the mean and the standard deviation over them (n - 1; 0 for one)."""
    t = torch.tensor([float(v) for v in values], dtype=torch.float64)
    return {"mean": float(t.mean()), "std": float(t.std()) if len(t) > 1 else 0.0}


def decoder_over_texts(runs: list[DecoderRun]) -> list[dict]:
    """Every decoder head's scores over the texts.   -> one dict per head, layer by layer

    Each dict: layer, head, role (``role_of`` on the mean scores), scores (pattern name ->
    spread), entropy (spread, nats), and ablation_delta (spread) when the runs have it.
    """
    first = runs[0].roles
    heads = []
    for layer, row in enumerate(first):
        for head in range(len(row)):
            per_run = [run.roles[layer][head] for run in runs]
            scores = {name: spread([r.scores[name] for r in per_run]) for name in DECODER_PATTERNS}
            record = {"layer": layer, "head": head, "role": role_of({n: v["mean"] for n, v in scores.items()}),
                      "scores": scores, "entropy": spread([r.entropy for r in per_run])}
            if runs[0].ablation_delta is not None:
                record["ablation_delta"] = spread([float(run.ablation_delta[layer, head]) for run in runs])
            heads.append(record)
    return heads


def encoder_over_texts(roles_per_text: list[list[list[HeadRole]]]) -> list[dict]:
    """Every encoder head's shares over the texts.   -> one dict per head, layer by layer

    Each dict: layer, head, role and share (``encoder_role`` on the mean shares and the
    mean focus share), shares (part -> spread), focus_share and entropy (spread, bits).
    """
    heads = []
    for layer, row in enumerate(roles_per_text[0]):
        for head in range(len(row)):
            per_text = [roles[layer][head] for roles in roles_per_text]
            shares = {part: spread([r.shares[part] for r in per_text]) for part in PARTS}
            focus = spread([r.focus.share if r.focus else 0.0 for r in per_text])
            role, share = encoder_role({p: v["mean"] for p, v in shares.items()}, focus["mean"])
            heads.append({"layer": layer, "head": head, "role": role, "share": share, "shares": shares,
                          "focus_share": focus, "entropy": spread([r.entropy for r in per_text])})
    return heads
