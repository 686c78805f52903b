"""The seed's pipeline, one pure function per step:

    sentence -> tokenize -> embed -> attention_scores -> softmax -> context_vectors

The names load on first use: the command line checks a sentence (``tokenize``) and the
embedding options (``embedding_options``) before torch is imported.
"""

from __future__ import annotations

import importlib

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


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'selfattn.pipeline' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
