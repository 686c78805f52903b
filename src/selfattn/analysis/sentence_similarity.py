"""How close sentences are: the cosine of every pair of sentence vectors, and the closest and farthest pair."""

from __future__ import annotations

import torch


def cosine_similarities(embeddings: torch.Tensor) -> torch.Tensor:
    """S = E E^T for rows of unit length: S_ij = cos(e_i, e_j).   (s, d) -> (s, s) float64

    Args:
        embeddings: (s, d), one unit-length row per sentence.

    Returns:
        (s, s) float64, the cosine of every pair.
    """
    e = embeddings.to(torch.float64)  # float64 so the diagonal is 1 to ~1e-7 and S stays symmetric
    return e @ e.T  # (s, d) @ (d, s) -> (s, s)


def extreme_pairs(similarity: torch.Tensor) -> tuple[tuple[int, int], tuple[int, int]]:
    """The most and least similar pairs i < j (first pair wins ties).   (s, s) with s >= 2

    Args:
        similarity: (s, s), the cosine of every pair.

    Returns:
        (i, j) of the most similar pair, then (i, j) of the least similar.
    """
    s = similarity.shape[0]
    pairs = [(i, j) for i in range(s) for j in range(i + 1, s)]
    most = max(pairs, key=lambda p: float(similarity[p]))
    least = min(pairs, key=lambda p: float(similarity[p]))
    return most, least
