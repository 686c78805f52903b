"""Attention kernels: tiled, exact, in readable torch (see flash.py)."""
from selfattn.kernels.backend import last_backend  # noqa: F401 - selfattn.kernels.last_backend()
