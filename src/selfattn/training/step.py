"""One training step and what it needs: the model as ids -> logits, the loss, the optimiser.

    loss = mean over positions of -log softmax(logits)[target]
    backward, clip the gradient norm, AdamW at the step's learning rate

``bench/train.py`` times exactly this step for ours and for its plain-torch peer.
"""

from __future__ import annotations

import signal

import torch

from selfattn.models.tokenizer import Encoded
from selfattn.training.settings import TrainConfig


class LanguageModel(torch.nn.Module):
    """ids (batch, seq) -> logits (batch, seq, vocab): the decoder without tokenising (what DDP wraps)."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        encoded = Encoded([], ids, torch.ones_like(ids))
        return self.model.run(encoded).logits


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """mean over positions of -log softmax(logits)[target].   (batch, seq, vocab), (batch, seq) -> ()"""
    picked = logits.gather(-1, targets[..., None])[..., 0]  # (batch, seq)
    return (logits.logsumexp(dim=-1) - picked).mean()


def train_step(network: torch.nn.Module, optimizer, inputs: torch.Tensor, targets: torch.Tensor, grad_clip: float) -> torch.Tensor:
    """One optimiser step: loss, backward, clip the gradient norm to ``grad_clip``, AdamW.

    Args:
        network: ids (batch, seq) -> logits (batch, seq, vocab).
        optimizer: its optimiser, learning rate already set.
        inputs, targets: (batch, seq) ids.
        grad_clip: the largest gradient norm.

    Returns:
        The batch's loss before the step, detached.
    """
    loss = next_token_loss(network(inputs), targets)
    loss.backward()
    # The optimiser's own list: walking the module tree for parameters() costs more than the clip on small models.
    torch.nn.utils.clip_grad_norm_([p for group in optimizer.param_groups for p in group["params"]], grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def optimizer_for(model: torch.nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW (betas 0.9, 0.99); weight decay on matrices and embeddings only (nanoGPT's grouping).

    Args:
        model: the model to train.
        config: the run's settings (lr, weight_decay).

    Returns:
        The optimiser.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": config.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.99), fused=True)


class Interrupts:
    """While training, Ctrl-C asks ``run`` to stop after the step it is in (sets run.stop_asked; then it saves).

    A second Ctrl-C stops at once; the files on disk are still the last checkpoint.
    """

    def __init__(self, run) -> None:
        self.run = run

    def __enter__(self):
        self.previous = signal.getsignal(signal.SIGINT)
        try:
            signal.signal(signal.SIGINT, self._ask)
        except ValueError:  # not the main thread: Ctrl-C keeps its usual meaning
            self.previous = None
        return self

    def _ask(self, signum, frame) -> None:
        if self.run.stop_asked:
            raise KeyboardInterrupt
        self.run.stop_asked = True

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
