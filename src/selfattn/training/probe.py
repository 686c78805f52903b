"""The fixed probe a run watches its heads on, their scores, and its attention stored compactly.

The probe is one induction sequence, the same for the whole run: ``<s>`` (when the
vocabulary has it), R random symbols without repeats, the same R again, as long as the
context allows (R = 31 at a context of 64 with ``<s>``) but R = 32 at most, so the
pictures stay readable at longer contexts. On it, every head of every layer gets four numbers:

    induction       mean weight from each token t of the second copy to t - R + 1, the token
                    after its first occurrence (ARENA's measure; 1 = a perfect induction head)
    previous_token  share of the weight on key i - 1, rows i >= 1 (TransformerLens's mul score)
    first_token     share of the weight on key 0, rows i >= 1
    entropy         mean over rows i >= 1 of -sum_j a_ij ln a_ij, in nats

(models.decoder_roles computes them; ``selfattn heads`` reads the same patterns.) A head
whose induction score passes INDUCTION_FORMED = 0.4 is called an induction head: at random
weights a head spreads its weight over the t + 1 keys it sees, which gives about 0.03 here,
and 0.4 is the score ``selfattn heads`` needs to name a role.

The probe's weights are kept every time the run logs: each layer and head's lower
triangle (the causal part, n (n + 1) / 2 numbers) in float16, one safetensors file per step
under probe/, about 34 KB for 2 layers of 4 heads at a context of 64.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from selfattn.analysis.decoder_roles import (
    classify_decoder_heads,
    induction_probe,
    induction_probe_score,
)
from selfattn.training.vocab import CharVocab

PROBE_SEED = 1234
MAX_PROBE_REPEAT = 32


def probe_ids(vocab: CharVocab, context: int) -> tuple[torch.Tensor, int, int]:
    """The run's probe.   -> ids (seq,), R, offset (1 with ``<s>`` first, else 0)"""
    offset = 1 if vocab.bos_id is not None else 0
    repeat = min((context - offset) // 2, MAX_PROBE_REPEAT, len(vocab.chars))
    avoid = [i for i in range(vocab.first_char) if i != vocab.bos_id]
    ids = induction_probe(vocab.size, repeat, seed=PROBE_SEED, first_id=vocab.bos_id, avoid=avoid)
    return ids, repeat, offset


def head_scores(weights: torch.Tensor, ids: torch.Tensor, repeat: int, offset: int) -> list[dict]:
    """Every head's four numbers on the probe.   weights: (layers, heads, seq, seq)

    Returns:
        One dict per head, layer by layer: layer, head, induction, previous_token,
            first_token, entropy (floats rounded to 4 decimals).
    """
    roles = classify_decoder_heads(weights, ids)
    induction = induction_probe_score(weights.double(), repeat, offset)  # (layers, heads)
    return [
        {"layer": layer, "head": head, "induction": round(float(induction[layer, head]), 4),
         "previous_token": round(role.previous_token, 4), "first_token": round(role.first_token, 4),
         "entropy": round(role.entropy, 4)}
        for layer, row in enumerate(roles) for head, role in enumerate(row)
    ]


def run_probe(model, ids: torch.Tensor, repeat: int, offset: int) -> tuple[torch.Tensor, dict]:
    """One forward pass on the probe, eval mode, no gradients: its attention and its losses.

    Returns:
        The weights, (layers, heads, seq, seq), and the cross-entropy on the probe's copies:
            {"first_copy": mean loss predicting tokens 2 .. R of the first copy,
            "second_copy": the same for the second copy}. An induction head brings the
            second far below the first, which no model can predict (random symbols).
    """
    module = getattr(model, "module", model)
    was_training = module.training
    module.eval()
    with torch.no_grad():
        out = module(ids[None], output_attentions=True)
    module.train(was_training)
    weights = torch.stack([a[0] for a in out.attentions]).float()  # layers x (heads, seq, seq)
    logits = out.logits[0].float()  # (seq, vocab)
    log_probs = logits - logits.logsumexp(dim=-1, keepdim=True)  # (seq, vocab)
    predicted = -log_probs[:-1].gather(1, ids[1:, None])[:, 0]  # (seq - 1,): loss of token t + 1 given ..t
    first = predicted[offset: offset + repeat - 1]  # tokens offset + 1 .. offset + R - 1
    second = predicted[offset + repeat: offset + 2 * repeat - 1]  # tokens offset + R + 1 .. offset + 2R - 1
    return weights, {"first_copy": round(float(first.mean()), 4), "second_copy": round(float(second.mean()), 4)}


def pack(weights: torch.Tensor) -> torch.Tensor:
    """(layers, heads, n, n) -> (layers, heads, n (n + 1) / 2) float16: the causal lower triangle."""
    n = weights.shape[-1]
    rows, cols = torch.tril_indices(n, n)
    return weights[..., rows, cols].to(torch.float16)


def unpack(packed: torch.Tensor, n: int) -> torch.Tensor:
    """The inverse of ``pack``: (layers, heads, n (n + 1) / 2) -> (layers, heads, n, n) float32, zeros above."""
    rows, cols = torch.tril_indices(n, n)
    full = torch.zeros((*packed.shape[:-1], n, n), dtype=torch.float32)
    full[..., rows, cols] = packed.float()
    return full


def save_snapshot(folder: Path, step: int, weights: torch.Tensor) -> None:
    """probe/step-NNNNNN.safetensors: the packed weights of one step."""
    from safetensors.torch import save_file

    folder.mkdir(exist_ok=True)
    save_file({"weights": pack(weights)}, str(folder / f"step-{step:06d}.safetensors"))


def read_snapshots(run: Path) -> list[tuple[int, torch.Tensor]]:
    """Every stored probe step of a run, in order.   -> [(step, (layers, heads, n, n) float32)]"""
    from safetensors.torch import load_file

    n = len(json.loads((Path(run) / "probe.json").read_text(encoding="utf-8"))["ids"])
    files = sorted((Path(run) / "probe").glob("step-*.safetensors"), key=lambda f: int(f.stem.split("-")[1]))
    return [(int(f.stem.split("-")[1]), unpack(load_file(str(f))["weights"], n)) for f in files]
