"""Attention kernels: tiled, exact, in readable torch (see flash.py)."""
