"""Copying a checkpoint into our modules by an explicit table of names.

Each family writes one rule per checkpoint tensor: its name there, the parameter(s) it
fills here, and a conversion when the layouts differ (GPT-2 keeps q, k and v in one
(d, 3d) matrix stored transposed). ``copy_weights`` then checks, before anything is
copied, that every checkpoint tensor is used or knowingly ignored, that every rule finds
its tensor, and that every shape fits; the table itself must fill every parameter of the
model exactly once (an assert: a gap there is our bug, not the user's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

from selfattn.errors import ModelError


@dataclass(frozen=True)
class WeightRule:
    """One checkpoint tensor -> one or more of our parameters.

    Attributes:
        source: the tensor's name in the checkpoint.
        targets: our parameter names it fills, in the order ``convert`` returns them.
        convert: the checkpoint tensor -> a tuple of tensors, one per target; None copies
            it as it is into the single target.
    """

    source: str
    targets: tuple[str, ...]
    convert: Callable[[torch.Tensor], tuple[torch.Tensor, ...]] | None = None
    join: Callable[[tuple[torch.Tensor, ...]], torch.Tensor] | None = None

    def tensors(self, tensor: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """What the rule writes into its targets."""
        return (tensor,) if self.convert is None else self.convert(tensor)

    def checkpoint_tensor(self, tensors: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The inverse: our target tensors -> the checkpoint's tensor (for saving)."""
        return tensors[0] if self.join is None else self.join(tensors)


def rule(source: str, target: str) -> WeightRule:
    """A tensor copied as it is."""
    return WeightRule(source, (target,))


def transposed(source: str, target: str) -> WeightRule:
    """A tensor stored (in, out), as GPT-2's Conv1D keeps it; ours is (out, in)."""
    return WeightRule(source, (target,), lambda t: (t.T,), lambda ts: ts[0].T.contiguous())


def split_columns(source: str, targets: tuple[str, ...], transpose: bool) -> WeightRule:
    """One fused tensor cut into len(targets) equal parts along its output axis (GPT-2's c_attn)."""
    parts = len(targets)

    def convert(tensor: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if transpose:
            tensor = tensor.T  # (in, parts * out) -> (parts * out, in)
        if tensor.shape[0] % parts:
            raise ModelError(f"{source} has shape {tuple(tensor.shape)}: its output axis does not split into {parts}")
        return tuple(tensor.chunk(parts, dim=0))

    def join(tensors: tuple[torch.Tensor, ...]) -> torch.Tensor:
        fused = torch.cat(tensors, dim=0)  # (parts * out, in) or (parts * out,)
        return fused.T.contiguous() if transpose else fused

    return WeightRule(source, targets, convert, join)


def copy_weights(
    model: nn.Module, state: dict[str, torch.Tensor], rules: Iterable[WeightRule], ignored: Callable[[str], bool], family: str
) -> None:
    """Copy ``state`` into ``model`` by ``rules``; refuse a missing, extra or mis-shaped tensor.

    Args:
        model: the module to fill; its parameters are overwritten in place.
        state: checkpoint name -> tensor.
        rules: one ``WeightRule`` per checkpoint tensor that is used.
        ignored: says which checkpoint names are known and unused (saved buffers,
            a tied output matrix stored twice, heads we do not run).
        family: the family's name, for the messages.

    Raises:
        ModelError: a tensor the rules need is missing, the checkpoint holds tensors no
            rule uses (named, at most five and a count), or a shape does not fit.
    """
    rules = list(rules)
    ours = dict(model.named_parameters())
    targets = [t for r in rules for t in r.targets]
    assert len(targets) == len(set(targets)) == len(ours), f"{family}: the rules fill {len(targets)} of {len(ours)} parameters"
    assert set(targets) == set(ours), f"{family}: the rules name {sorted(set(targets) ^ set(ours))[:5]}"
    missing = [r.source for r in rules if r.source not in state]
    used = {r.source for r in rules}
    extra = sorted(name for name in state if name not in used and not ignored(name))
    if missing:
        raise ModelError(f"the checkpoint does not fit {family}: it lacks {_some(missing)}")
    if extra:
        raise ModelError(f"the checkpoint does not fit {family}: tensors no {family} layer uses: {_some(extra)}")
    filled = []
    for r in rules:
        tensors = r.tensors(state[r.source])
        for name, tensor in zip(r.targets, tensors):
            if tuple(tensor.shape) != tuple(ours[name].shape):
                shape = tuple(state[r.source].shape)
                raise ModelError(
                    f"the checkpoint does not fit {family}: {r.source} has shape {shape}, "
                    f"which does not give {name} its shape {tuple(ours[name].shape)}"
                )
            filled.append((ours[name], tensor))
    with torch.no_grad():  # only after every check passed: a refused checkpoint changes nothing
        for param, tensor in filled:
            param.copy_(tensor)


def export_weights(model: nn.Module, rules: Iterable[WeightRule]) -> dict[str, torch.Tensor]:
    """The checkpoint a model would be loaded from: ``rules`` run backwards (for saving).

    Args:
        model: the module whose parameters are saved.
        rules: the family's table, as ``copy_weights`` reads it.

    Returns:
        Checkpoint name -> a detached, contiguous tensor; loading it back with the same
            rules gives the same parameters.
    """
    ours = dict(model.named_parameters())
    with torch.no_grad():
        return {r.source: r.checkpoint_tensor(tuple(ours[t].detach() for t in r.targets)).contiguous().clone() for r in rules}


def _some(names: list[str]) -> str:
    shown = ", ".join(names[:5])
    return shown if len(names) <= 5 else f"{shown} and {len(names) - 5} more"
