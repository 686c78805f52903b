"""The processes a run trains in: one, or the ranks ``torchrun`` started (gloo, CPU).

Every rank draws the same global batch and keeps its rows (``share``); gradients are
averaged by DistributedDataParallel, the reported loss by an all-reduce (``mean``), and
a Ctrl-C on any rank stops every rank at the same step (``any``).
"""

from __future__ import annotations

import os

import torch

from selfattn.errors import TrainingError


class Processes:
    """This process's rank among ``world`` (1 without torchrun)."""

    def __init__(self, rank: int = 0, world: int = 1, owned: bool = False) -> None:
        self.rank, self.world, self.owned = rank, world, owned

    @classmethod
    def from_environment(cls) -> "Processes":
        """One process, or torchrun's ranks (WORLD_SIZE > 1), joined over gloo."""
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        if world <= 1:
            return cls()
        import torch.distributed as dist

        owned = not dist.is_initialized()
        if owned:
            dist.init_process_group("gloo")
        return cls(dist.get_rank(), dist.get_world_size(), owned)

    def close(self) -> None:
        """Leave the process group if this run joined it."""
        if self.owned:
            import torch.distributed as dist

            dist.destroy_process_group()
            self.owned = False

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that writes the files and shows progress."""
        return self.rank == 0

    def describe(self) -> str:
        """How many processes train, for the run's first line."""
        return "1 process" if self.world == 1 else f"{self.world} processes (DistributedDataParallel, gloo)"

    def check_batch(self, batch_size: int) -> None:
        """Every rank must get the same number of rows.   Raises TrainingError otherwise."""
        if batch_size % self.world:
            raise TrainingError(f"batch_size {batch_size} must divide among the {self.world} processes")

    def wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        """The module itself, or wrapped in DistributedDataParallel under torchrun."""
        if self.world == 1:
            return module
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(module)

    def share(self, rows: torch.Tensor) -> torch.Tensor:
        """This rank's contiguous slice of the global batch."""
        if self.world == 1:
            return rows
        size = rows.shape[0] // self.world
        return rows[self.rank * size:(self.rank + 1) * size]

    def mean(self, value: torch.Tensor) -> float:
        """The mean of ``value`` over the ranks."""
        if self.world == 1:
            return float(value)
        import torch.distributed as dist

        total = value.clone().float()
        dist.all_reduce(total)
        return float(total) / self.world

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any rank."""
        if self.world == 1:
            return flag
        import torch.distributed as dist

        value = torch.tensor([1.0 if flag else 0.0])
        dist.all_reduce(value)
        return bool(value > 0)

    def barrier(self) -> None:
        """Wait for every rank (nothing to wait for alone)."""
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()
