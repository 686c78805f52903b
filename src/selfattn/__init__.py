"""selfattn: transformer self-attention from scratch, every step explained with real numbers.

Axis order everywhere: (batch, heads, seq, d_head); see ``selfattn.shapes``.

The public names below load lazily, so ``selfattn --help`` does not pay for importing
torch.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "tokenize": "selfattn.pipeline.tokenize",
    "embed": "selfattn.pipeline.embeddings",
    "seed_embeddings": "selfattn.pipeline.embeddings",
    "random_embeddings": "selfattn.pipeline.embeddings",
    "resolve_embeddings": "selfattn.pipeline.embeddings",
    "SEED_SENTENCE": "selfattn.pipeline.embeddings",
    "SEED_TABLE": "selfattn.pipeline.embeddings",
    "load_embedding_file": "selfattn.pipeline.embedding_files",
    "attention_scores": "selfattn.pipeline.steps",
    "attention_scores_loop": "selfattn.pipeline.steps",
    "softmax": "selfattn.pipeline.steps",
    "softmax_naive": "selfattn.pipeline.steps",
    "softmax_stable": "selfattn.pipeline.steps",
    "softmax_parts": "selfattn.pipeline.steps",
    "context_vectors": "selfattn.pipeline.steps",
    "context_vector_loop": "selfattn.pipeline.steps",
    "self_attention": "selfattn.pipeline.steps",
    "ExplainConfig": "selfattn.config",
    "build_trace": "selfattn.config",
    "Trace": "selfattn.trace",
    "QueryTrace": "selfattn.trace",
    "trace_self_attention": "selfattn.trace",
    "SelfAttnError": "selfattn.errors",
    "SentenceError": "selfattn.errors",
    "QueryError": "selfattn.errors",
    "EmbeddingError": "selfattn.errors",
    "OptionError": "selfattn.errors",
    "ShapeError": "selfattn.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'selfattn' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
