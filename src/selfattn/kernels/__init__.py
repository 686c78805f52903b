"""Attention kernels: tiled, exact, in readable torch (see flash.py).

``last_backend`` and ``tile_choice`` load on first use: the tile sizes' check (``tile_sizes``) is read by the
command line before torch is imported.
"""

from __future__ import annotations

from selfattn.lazy import lazy_names

__getattr__, __dir__ = lazy_names(globals(), {
    "last_backend": "selfattn.kernels.backend",  # selfattn.kernels.last_backend()
    "tile_choice": "selfattn.kernels.tile_fit",  # selfattn.kernels.tile_choice(q_len, kv_len, ...): what tiles, and why
})
