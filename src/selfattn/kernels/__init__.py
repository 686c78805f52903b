"""Attention kernels: tiled, exact, in readable torch (see flash.py).

``last_backend`` loads on first use: the tile sizes' check (``tile_sizes``) is read by the
command line before torch is imported.
"""

from __future__ import annotations

import importlib


def __getattr__(name: str):
    if name == "last_backend":  # selfattn.kernels.last_backend()
        value = importlib.import_module("selfattn.kernels.backend").last_backend
        globals()[name] = value
        return value
    raise AttributeError(f"module 'selfattn.kernels' has no attribute {name!r}")
