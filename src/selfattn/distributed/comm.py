"""The ring's communication: one shift (send to the next rank, receive from the previous),
and one agreement on the inputs before anything is sent.

Only torch.distributed's point-to-point and all-gather operations are used. Sends and
receives are posted together with ``batch_isend_irecv``: a blocking send followed by a
blocking receive on every rank deadlocks on gloo, because each rank waits for its send
to be received while its neighbour is waiting for the same. Every failure of the process
group (a rank that stopped, a timeout) becomes a ``DistributedError`` that names this
rank and what it was doing, so a crash on one rank ends every rank with a clear error
instead of a hang or a transport message.
"""

from __future__ import annotations

import torch

from selfattn.errors import DistributedError


class Ring:
    """This process's place in a ring of ``size`` ranks: it sends to ``rank + 1`` and receives from ``rank - 1``."""

    def __init__(self, group=None) -> None:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise DistributedError(
                "ring attention needs torch.distributed: call torch.distributed.init_process_group first "
                "(torchrun sets up the environment for it)"
            )
        self.dist = dist
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        if self.rank < 0:
            raise DistributedError("this process is not a member of the process group given to ring attention")
        world = group if group is not None else dist.group.WORLD
        self.next = dist.get_global_rank(world, (self.rank + 1) % self.size)
        self.prev = dist.get_global_rank(world, (self.rank - 1) % self.size)

    def source(self, step: int) -> int:
        """The rank whose key/value shard this rank holds at ``step`` (its own at step 0)."""
        return (self.rank - step) % self.size

    def shift(self, tensors: list[torch.Tensor], recv_len: int, what: str) -> "Transfer":
        """Post: send ``tensors`` to the next rank, receive tensors like them (with ``recv_len``
        positions on axis -2) from the previous one. Returns at once; ``wait()`` gives the
        received tensors. With one rank the tensors come straight back."""
        if self.size == 1:
            return Transfer(self, [], tensors, what)
        received = [t.new_empty((*t.shape[:-2], recv_len, t.shape[-1])) for t in tensors]
        ops = [self.dist.P2POp(self.dist.isend, t, self.next, self.group) for t in tensors]
        ops += [self.dist.P2POp(self.dist.irecv, r, self.prev, self.group) for r in received]
        try:
            works = self.dist.batch_isend_irecv(ops)
        except RuntimeError as error:
            raise self.failure(f"sending {what}", error) from error
        return Transfer(self, works, received, what)

    def agree(self, mine: dict) -> list[dict]:
        """Every rank's ``mine``, in rank order (one all-gather of small picklable dicts)."""
        everyone: list = [None] * self.size
        try:
            self.dist.all_gather_object(everyone, mine, group=self.group)
        except RuntimeError as error:
            raise self.failure("comparing the inputs of every rank", error) from error
        return everyone

    def failure(self, what: str, error: Exception) -> DistributedError:
        cause = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return DistributedError(
            f"ring attention on rank {self.rank} of {self.size}: {what} failed: another rank probably stopped "
            f"with an error, or the process group timed out ({cause[:300]})"
        )


class Transfer:
    """A posted shift; ``wait()`` blocks until it is done and returns what was received."""

    def __init__(self, ring: Ring, works: list, received: list[torch.Tensor], what: str) -> None:
        self.ring, self.works, self.received, self.what = ring, works, received, what

    def wait(self) -> list[torch.Tensor]:
        try:
            for work in self.works:
                work.wait()
        except RuntimeError as error:
            raise self.ring.failure(f"receiving {self.what} from rank {(self.ring.rank - 1) % self.ring.size}", error) from error
        return self.received
