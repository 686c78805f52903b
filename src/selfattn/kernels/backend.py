"""Which kernel runs a flash call: the torch kernel or the Triton one, and why.

``backend="auto"`` takes Triton for CUDA tensors when triton is installed and the call is
one the Triton kernel does (no dropout, no score_mod other than ALiBi, tiles that are
powers of two); otherwise the torch kernel. ``backend="triton"`` insists, and says why when
it cannot; on CPU tensors it runs only under Triton's interpreter (``TRITON_INTERPRET=1``
set before triton is imported), which is how the tests check the kernel without a GPU.
``last_backend()`` tells which ran, with the reason. Nothing here imports triton.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading

import torch

from selfattn.errors import OptionError

BACKENDS = ("auto", "torch", "triton")
_last = threading.local()


class Backend(str):
    """A backend's name ("torch" or "triton"), with ``reason``: why it was the one that ran."""

    reason: str

    def __new__(cls, name: str, reason: str) -> "Backend":
        made = super().__new__(cls, name)
        made.reason = reason
        return made


def last_backend() -> Backend | None:
    """Which kernel ran this thread's last flash call: "torch" or "triton" (None before any).   -> Backend (a str)

    The answer is a str that also carries ``.reason``, e.g. "CUDA tensors and triton
    installed" or "backend='auto' on CPU tensors: the torch kernel".

    Examples:
        >>> import selfattn as sa
        >>> import torch
        >>> from selfattn.kernels import last_backend
        >>> q = torch.randn(1, 2, 5, 8)  # (batch, heads, seq, d)
        >>> _ = sa.flash_attention(q, q, q, is_causal=True)
        >>> last_backend(), last_backend().reason
        ('torch', 'CPU tensors: the torch kernel (Triton runs on CUDA)')
    """
    return getattr(_last, "backend", None)


def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """Whether our Triton kernels run in Triton's interpreter: made so when first imported
    (TRITON_INTERPRET=1 then), or, before that, whether the variable is set now."""
    kernels = sys.modules.get("selfattn.kernels.triton_kernels")
    if kernels is not None:
        return kernels.INTERPRETED
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def on_gpu(tensor: torch.Tensor) -> bool:
    return tensor.is_cuda


def choose_backend(backend: str, query: torch.Tensor, *, dropout_p: float = 0.0, score_mod=None,
                   block_q: int | None = None, block_k: int | None = None) -> Backend:
    """The backend for this call, recorded for ``last_backend``; backend="triton" that cannot run raises OptionError."""
    if backend not in BACKENDS:
        raise OptionError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    if backend == "torch":
        return _record("torch", "backend='torch'")
    problem = _triton_problem(query, dropout_p, score_mod, block_q, block_k, explicit=backend == "triton")
    if problem is None:
        return _record("triton", "backend='triton'" if backend == "triton" else "CUDA tensors and triton installed")
    if backend == "triton":
        raise OptionError(f"backend='triton' cannot run this call: {problem}")
    return _record("torch", problem + ": the torch kernel" if on_gpu(query) else
                   "CPU tensors: the torch kernel (Triton runs on CUDA)")


def _triton_problem(query, dropout_p, score_mod, block_q, block_k, explicit: bool) -> str | None:
    """Why the Triton kernel cannot take this call, or None."""
    if not on_gpu(query) and not (explicit and interpreting()):
        return "the tensors are on the CPU; Triton needs CUDA tensors (or TRITON_INTERPRET=1 for its interpreter)"
    if not triton_installed():
        return "triton is not installed (pip install 'selfattn[gpu]')"
    if query.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return f"the Triton kernel takes float32, float16 and bfloat16, not {query.dtype}"
    if query.shape[-1] > 256:
        return f"the Triton kernel takes head dims up to 256, got {query.shape[-1]}"
    if dropout_p:
        return "dropout runs on the torch kernel only"
    if score_mod is not None and getattr(score_mod, "alibi", None) is None:
        return "a score_mod runs on the torch kernel only (the Triton kernel has ALiBi built in)"
    if score_mod is not None and any(t.requires_grad for t in score_mod.captured):
        return "ALiBi slopes that want a gradient run on the torch kernel only"
    return block_size_error(block_q, block_k)


def block_size_error(block_q, block_k) -> str | None:
    """Why these tile sizes cannot be Triton's (powers of two from 16, for tl.arange and tl.dot), or None."""
    for name, size in (("block_q", block_q), ("block_k", block_k)):
        if size is not None and (size < 16 or size & (size - 1)):
            return f"the Triton kernel's tiles are powers of two from 16, got {name}={size}"
    return None


def _record(name: str, reason: str) -> Backend:
    _last.backend = Backend(name, reason)
    return _last.backend
