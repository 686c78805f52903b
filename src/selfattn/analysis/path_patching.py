"""Path patching: does what some heads write reach other heads' queries, keys or values?

Activation patching moves a head's whole output from the clean run into the corrupted
one, and its effect then reaches everything after it. Path patching lets it reach only
the chosen inputs of the chosen heads (Wang et al. 2022; Goldowsky-Dill et al. 2023):

    1. run the clean and the corrupted input; keep every sender's output r_s = z_s W_o,s
       (through a post-attention norm where the block has one) and, on the corrupted run,
       the residual stream entering each receiver's layer, x_L
    2. x'_L = x_L + sum_s (r_s[clean] - r_s[corrupted])      (senders in earlier layers)
       the stream the receivers would read if only the senders' clean outputs had reached
       them directly, everything else (other heads, MLPs, embeddings) as in the corrupted run
    3. the receivers' chosen inputs (q, k and/or v: projected from Norm(x'_L), RoPE applied)
    4. run the corrupted input with only those inputs replaced, everything after them
       computed again, and read the target's log-probability at the last position

    recovered = (lp_patched - lp_corrupted) / (lp_clean - lp_corrupted)

With grouped key/value heads a receiver's k and v belong to its key/value head, which
other query heads read too: replacing them changes those heads' inputs as well, and the
record names them (``touched``). ``positions`` keeps the senders' clean output to some
positions (the rest stays corrupted).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from selfattn.analysis.hooks import capture, hooks, model_blocks
from selfattn.analysis.next_token import gap_warning
from selfattn.analysis.stream import head_parts
from selfattn.attention.points import point_name
from selfattn.errors import OptionError

VIA = ("q", "k", "v")


@dataclass(frozen=True)
class PathPatching:
    """One path-patching run (``path_patching``).

    Attributes:
        recovered: the share of the clean answer the path brings back (float).
        senders, receivers: the (layer, head) pairs, as checked.
        via: the receivers' inputs replaced, a subset of "q", "k", "v" in that order.
        touched: query heads that are not receivers but read a replaced key/value head
            (grouped key/value heads), [(layer, head), ...].
        positions: the positions where the senders' clean output was let through (None: all).
        lp_patched, lp_clean, lp_corrupted: the target's log-probabilities.
        target: the target's id.
    """

    recovered: float
    senders: list[tuple[int, int]]
    receivers: list[tuple[int, int]]
    via: tuple[str, ...]
    touched: list[tuple[int, int]]
    positions: list[int] | None
    lp_patched: float
    lp_clean: float
    lp_corrupted: float
    target: int = -1

    @property
    def warning(self) -> str | None:
        """Why the fraction means little (``next_token.gap_warning``), or None."""
        return gap_warning(self.lp_clean, self.lp_corrupted)


def check_via(via) -> tuple[str, ...]:
    """The receivers' inputs named: "q", "k", "v", a string of them ("qk", "qkv") or a list.

    Raises:
        OptionError: anything else, or a letter twice.
    """
    letters = list(via) if isinstance(via, (str, list, tuple)) else None
    if not letters or any(x not in VIA for x in letters) or len(set(letters)) != len(letters):
        raise OptionError(f'via names the receivers\' inputs: "q", "k", "v" or several of them ("qk", "qkv"), got {via!r}')
    return tuple(x for x in VIA if x in letters)


def check_path(model, senders, receivers) -> None:
    """Every sender must come before every receiver (a head reads only what earlier layers wrote).

    Raises:
        OptionError: a sender in a receiver's layer or after it, or an empty list.
    """
    if not senders or not receivers:
        raise OptionError("path patching needs at least one sender and one receiver")
    first = min(layer for layer, _ in receivers)
    late = [f"{l}.{h}" for l, h in senders if l >= first]
    if late:
        raise OptionError(f"sender {late[0]} is not before every receiver: a head reads only what earlier layers "
                          f"wrote, and the first receiver is in layer {first}")


def path_points(senders, receivers) -> list[str]:
    """The points path patching reads on the clean and the corrupted run: the senders' layers' z, the
    receivers' layers' incoming stream."""
    return ([point_name(l, "z") for l in sorted({l for l, _ in senders})]
            + [point_name(l, "resid_pre") for l in sorted({l for l, _ in receivers})])


def path_patching(model, runs, seen, wanted: int, senders, receivers, via: tuple[str, ...], positions, log_prob,
                  lp_clean: float, lp_corrupted: float) -> PathPatching:
    """Path patching on inputs already checked (see the module docstring).

    Args:
        model: a decoder.
        runs: the clean and corrupted ``Encoded`` inputs, batch 1, one length.
        seen: the values at ``path_points`` on the clean run and on the corrupted run.
        wanted: the target's id.
        senders, receivers: checked (layer, head) pairs (``check_heads``, ``check_path``).
        via: checked inputs (``check_via``).
        positions: checked positions, or None for all.
        log_prob: (rows, seq, vocab) logits -> the target's log-probability at the last position (rows,).
        lp_clean, lp_corrupted: the target's log-probabilities on the two inputs.
    """
    blocks = model_blocks(model)
    sender_layers = sorted({l for l, _ in senders})
    receiver_layers = sorted({l for l, _ in receivers})
    clean, corrupted = seen
    delta = torch.zeros_like(corrupted[point_name(receiver_layers[0], "resid_pre")], dtype=torch.float64)  # (1, n, d)
    for layer in sender_layers:
        heads = [h for l, h in senders if l == layer]
        name = point_name(layer, "z")
        parts = [head_parts(blocks[layer], run[name][0].transpose(0, 1))[:, heads].sum(dim=1) for run in (clean, corrupted)]
        delta[0] += parts[0] - parts[1]  # (n, d): what the senders wrote on the clean run, less the corrupted
    if positions is not None:
        keep = torch.zeros(delta.shape[1], dtype=torch.bool)
        keep[positions] = True
        delta[0, ~keep] = 0
    # The receivers' inputs as the stream x'_L gives them: one run per receiver layer, from layer L's input.
    wanted_points = {layer: [point_name(layer, x) for x in via] for layer in receiver_layers}
    inputs = {}
    for layer in receiver_layers:
        stream = corrupted[point_name(layer, "resid_pre")]
        moved = (stream.double() + delta).to(stream.dtype)
        with hooks(model, {point_name(layer, "resid_pre"): lambda x, p, moved=moved: moved}), \
                capture(model, wanted_points[layer]) as values, torch.no_grad():
            model.run(runs[1], last_only=True)
        inputs[layer] = values
    # The corrupted run with only the receivers' chosen inputs replaced.
    table, touched = {}, set()
    for layer in receiver_layers:
        heads = [h for l, h in receivers if l == layer]
        group = blocks[layer].attention.config.n_heads // blocks[layer].attention.config.n_kv_heads
        for x in via:
            rows = heads if x == "q" else sorted({h // group for h in heads})
            if x != "q":
                touched |= {(layer, g * group + i) for g in rows for i in range(group)} - set(receivers)
            source = inputs[layer][point_name(layer, x)]
            table[point_name(layer, x)] = _replace_heads(rows, source)
    with hooks(model, table), torch.no_grad():
        lp_patched = float(log_prob(model.run(runs[1], last_only=True).logits))
    return PathPatching((lp_patched - lp_corrupted) / (lp_clean - lp_corrupted), list(senders), list(receivers), via,
                        sorted(touched), None if positions is None else list(positions), lp_patched, lp_clean, lp_corrupted,
                        wanted)


def _replace_heads(rows: list[int], source: torch.Tensor):
    """A hook that sets heads ``rows`` (axis 1) of the value to ``source``'s."""
    def hook(value: torch.Tensor, point) -> torch.Tensor:
        value = value.clone()  # (1, H or Hkv, n, d_head)
        value[:, rows] = source[:, rows]
        return value

    return hook
