"""The seed's pipeline, one pure function per step:

    sentence -> tokenize -> embed -> attention_scores -> softmax -> context_vectors
"""

from selfattn.pipeline.embeddings import SEED_SENTENCE, SEED_TABLE, embed, random_embeddings, seed_embeddings
from selfattn.pipeline.steps import (
    attention_scores,
    attention_scores_loop,
    context_vector_loop,
    context_vectors,
    plain_division,
    self_attention,
    softmax,
    softmax_naive,
    softmax_parts,
    softmax_stable,
)
from selfattn.pipeline.tokenize import tokenize

__all__ = [
    "SEED_SENTENCE",
    "SEED_TABLE",
    "attention_scores",
    "attention_scores_loop",
    "context_vector_loop",
    "context_vectors",
    "embed",
    "plain_division",
    "random_embeddings",
    "seed_embeddings",
    "self_attention",
    "softmax",
    "softmax_naive",
    "softmax_parts",
    "softmax_stable",
    "tokenize",
]
