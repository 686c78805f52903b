"""The seed's pipeline, one pure function per step:

    sentence -> tokenize -> embed -> attention_scores -> softmax -> context_vectors

The names load on first use: the command line checks a sentence (``tokenize``) and the
embedding options (``embedding_options``) before torch is imported.
"""

from __future__ import annotations

from selfattn.lazy import lazy_names

_EXPORTS = {
    "SEED_SENTENCE": "selfattn.pipeline.embedding_options",
    "SEED_TABLE": "selfattn.pipeline.embedding_options",
    "embed": "selfattn.pipeline.embeddings",
    "random_embeddings": "selfattn.pipeline.embeddings",
    "seed_embeddings": "selfattn.pipeline.embeddings",
    "tokenize": "selfattn.pipeline.tokenize",
    **{name: "selfattn.pipeline.steps" for name in (
        "attention_scores", "attention_scores_loop", "context_vector_loop", "context_vectors", "plain_division",
        "self_attention", "softmax", "softmax_naive", "softmax_parts", "softmax_stable")},
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_names(globals(), _EXPORTS)
