"""What a model trains on: batches of (inputs, targets), the same for the same seed and step.

    induction   <s>, r (R random symbols), r again, and again while it fits the context
                R is drawn per sequence from min_repeat .. (context - 1) // 2, so the earlier
                copy sits at any distance: a head that copies from a fixed offset cannot
                solve it, an induction head can. (Random symbols between the copies, which
                we tried first, leave too little to predict: at width 128 no head had
                formed after 1500 steps.)
    text        windows of `context` characters at random places of the corpus's first 90%
                (training) or its last 10% (validation), targets shifted by one

Every batch comes from its own torch.Generator seeded by (seed, step): a resumed run, or
each rank of a distributed one, draws exactly the batches of an uninterrupted single
process. Validation batches are fixed for the run.

    inputs, targets = task.batch(step, size)        # (size, context) int64 each
"""

from __future__ import annotations

import torch

from selfattn.errors import TrainingError
from selfattn.training.vocab import CharVocab

VAL_SHARE = 0.1  # the corpus's last tenth is held out, as nanoGPT's shakespeare_char
_VAL_STREAM = 1 << 40  # generator seeds for validation batches start here, far from any step's


def step_generator(seed: int, step: int) -> torch.Generator:
    """The generator of one step's batch: seeded by (seed, step), independent of what came before."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


class InductionTask:
    """Sequences with one repeated random segment (see the module docstring).

    Args:
        vocab: the vocabulary (``CharVocab.for_induction``): ``<s>`` and the symbols.
        context: the model's context, tokens per input row.
        seed: the run's seed.
        min_repeat: the shortest repeated segment R.
    """

    name = "induction"

    def __init__(self, vocab: CharVocab, context: int, seed: int, min_repeat: int = 8) -> None:
        self.vocab, self.context, self.seed = vocab, context, seed
        self.max_repeat = (context - 1) // 2  # <s> + r + r fits in context + 1 tokens
        self.min_repeat = min_repeat
        if not 2 <= min_repeat <= self.max_repeat:
            raise TrainingError(f"the induction task needs 2 <= min_repeat <= (context - 1) // 2 = {self.max_repeat}")

    def batch(self, step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch of ``step``.   -> inputs, targets: (size, context) int64"""
        return self._draw(step_generator(self.seed, step), size)

    def val_batch(self, index: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Validation batch ``index``, the same throughout the run."""
        return self._draw(step_generator(self.seed, _VAL_STREAM + index), size)

    def _draw(self, generator: torch.Generator, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        v, n = self.vocab, self.context + 1
        symbols = torch.randint(v.first_char, v.size, (size, n), generator=generator)  # (size, n) random symbols
        repeat = torch.randint(self.min_repeat, self.max_repeat + 1, (size,), generator=generator)  # (size,) R
        source = 1 + (torch.arange(n - 1)[None, :] % repeat[:, None])  # (size, n - 1): position t holds r[t mod R]
        rows = torch.cat([torch.full((size, 1), v.bos_id), symbols.gather(1, source)], dim=1)  # (size, n)
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()  # (size, context) each


class TextTask:
    """Windows of a character-level corpus.

    Args:
        ids: the corpus as ids, (chars,) int64.
        vocab: its vocabulary.
        context: characters per input row.
        seed: the run's seed.

    Raises:
        TrainingError: either part is shorter than context + 1 characters.
    """

    name = "text"

    def __init__(self, ids: torch.Tensor, vocab: CharVocab, context: int, seed: int) -> None:
        cut = int(len(ids) * (1 - VAL_SHARE))
        self.train_ids, self.val_ids = ids[:cut], ids[cut:]
        self.vocab, self.context, self.seed = vocab, context, seed
        need = context + 1
        if len(self.val_ids) < need or len(self.train_ids) < need:
            raise TrainingError(
                f"the corpus has {len(ids)} characters; with a context of {context} it needs at least "
                f"{min_text_chars(context)} (context + 1 in its validation tenth too)"
            )

    def batch(self, step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch of ``step``.   -> inputs, targets: (size, context) int64"""
        return self._windows(self.train_ids, step_generator(self.seed, step), size)

    def val_batch(self, index: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Validation batch ``index``, the same throughout the run."""
        return self._windows(self.val_ids, step_generator(self.seed, _VAL_STREAM + index), size)

    def _windows(self, ids: torch.Tensor, generator: torch.Generator, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(0, len(ids) - self.context, (size,), generator=generator)  # (size,)
        offsets = starts[:, None] + torch.arange(self.context + 1)  # (size, context + 1)
        rows = ids[offsets]
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def min_text_chars(context: int) -> int:
    """The shortest corpus whose validation tenth still holds one window of context + 1."""
    return int((context + 1) / VAL_SHARE) + 2
