"""selfattn: transformer self-attention from scratch, every step explained with real numbers.

The public API by task (``import selfattn as sa``; names load on first use). Arguments,
shapes and examples: ``help(sa.NAME)``, or the API reference (docs/reference.md; ``make
docs`` builds the site). Axes: (batch, heads, seq, d_head); masks are bool, True = may attend.

The seed, step by step    tokenize, seed_embeddings, embed, random_embeddings,
                          load_embedding_file, attention_scores, softmax (softmax_stable,
                          softmax_naive, softmax_parts; plain_division, its naive rival),
                          context_vectors, self_attention
Every intermediate        AttentionTrace (the record trace_self_attention, trace_variant and
                          build_trace return); ExplainConfig + build_trace (what `selfattn
                          explain` runs); compare -> Comparison; explore(record)
Attention functions       scaled_dot_product_attention (torch's signature),
                          scaled_dot_product_attention_with_weights, attention_steps
Long sequences            flash_attention (tiled, exact, O(N) memory, with backward),
                          attention_probs_from_lse (exact weights of chosen rows);
                          flex_attention (score_mod, create_block_mask, and_masks,
                          or_masks; backward on the CPU), flash_attn_func (flash-attn's)
Modules                   MultiHeadAttention (GQA, cross-attention, RoPE, ALiBi, flash),
                          SelfAttention, KVCache, Transformer, TransformerBlock,
                          FeedForward, GatedFeedForward (SwiGLU), RMSNorm, rms_norm;
                          configs AttentionConfig, TransformerConfig
To and from torch.nn      from_torch, TorchStyleMultiheadAttention, torch_masks_to_ours
Masks                     causal_mask, causal_top_left, causal_bottom_right,
                          sliding_window_mask, padding_mask, user_mask, combine_masks;
                          rules the kernel skips tiles with: selfattn.masks
Positions                 sinusoidal_encoding, LearnedPositionalEmbedding, apply_rope,
                          rope_angles, rope_distance_check, alibi_slopes, alibi_bias
Pretrained models         load_pretrained("all-MiniLM-L6-v2" | "stories260K" | FOLDER | FILE.bin
                          | "org/name") -> BertModel | DecoderModel -> ModelOutput;
                          DecoderModel.generate -> Generation; integrations.transformers
Circuits                  hooks, capture; ablate, patch_heads, attribute, composition_scores
Training                  train(task="induction" | "text", ...) -> TrainingRun (shipped:
                          "tiny-induction", "tiny-shakespeare"); across processes: ring_attention
Errors                    SelfAttnError (a ValueError) and its subclasses ConfigError,
                          SentenceError, QueryError, EmbeddingError, OptionError,
                          ShapeError, ModelError, DistributedError, TrainingError

Commands: ``selfattn explain | plot | view | heads | similarity | compare | generate | ablate | patch | attribute | train | serve``.
"""

from __future__ import annotations

from selfattn.lazy import lazy_names
import sys

__version__ = "0.1.0"

_EXPORTS = {
    "tokenize": "selfattn.pipeline.tokenize",
    "embed": "selfattn.pipeline.embeddings",
    "seed_embeddings": "selfattn.pipeline.embeddings",
    "random_embeddings": "selfattn.pipeline.embeddings",
    "resolve_embeddings": "selfattn.pipeline.embeddings",
    "SEED_SENTENCE": "selfattn.pipeline.embedding_options",
    "SEED_TABLE": "selfattn.pipeline.embedding_options",
    "load_embedding_file": "selfattn.pipeline.embedding_files",
    "attention_scores": "selfattn.pipeline.steps",
    "attention_scores_loop": "selfattn.pipeline.steps",
    "softmax": "selfattn.pipeline.steps",
    "softmax_naive": "selfattn.pipeline.steps",
    "plain_division": "selfattn.pipeline.steps",
    "softmax_stable": "selfattn.pipeline.steps",
    "softmax_parts": "selfattn.pipeline.steps",
    "context_vectors": "selfattn.pipeline.steps",
    "context_vector_loop": "selfattn.pipeline.steps",
    "self_attention": "selfattn.pipeline.steps",
    "ExplainConfig": "selfattn.commands.explain_options",
    "build_trace": "selfattn.commands.traces",
    "AttentionTrace": "selfattn.trace.record",
    "Trace": "selfattn.trace.seed",
    "QueryTrace": "selfattn.trace.seed",
    "trace_self_attention": "selfattn.trace.seed",
    "compare": "selfattn.commands.compare",
    "ablate": "selfattn.analysis.head_interventions",
    "hooks": "selfattn.analysis.hooks",
    "attribute": "selfattn.analysis.attribution",
    "composition_scores": "selfattn.analysis.head_composition",
    "Composition": "selfattn.analysis.head_composition",
    "Attribution": "selfattn.analysis.attribution",
    "capture": "selfattn.analysis.hooks",
    "point_names": "selfattn.analysis.hooks",
    "Point": "selfattn.attention.points",
    "patch_heads": "selfattn.analysis.head_interventions",
    "Comparison": "selfattn.analysis.comparison",
    "HeadComparison": "selfattn.analysis.comparison",
    "scaled_dot_product_attention": "selfattn.attention.functional",
    "scaled_dot_product_attention_with_weights": "selfattn.attention.functional",
    "attention_steps": "selfattn.attention.functional",
    "AttentionConfig": "selfattn.attention.config",
    "TransformerConfig": "selfattn.attention.config",
    "SelfAttention": "selfattn.attention.self_attention",
    "MultiHeadAttention": "selfattn.attention.modules",
    "KVCache": "selfattn.attention.kv_cache",
    "FeedForward": "selfattn.attention.transformer",
    "GatedFeedForward": "selfattn.attention.norm_and_mlp",
    "RMSNorm": "selfattn.attention.norm_and_mlp",
    "rms_norm": "selfattn.attention.norm_and_mlp",
    "TransformerBlock": "selfattn.attention.transformer",
    "Transformer": "selfattn.attention.transformer",
    "TransformerOutput": "selfattn.attention.transformer",
    "from_torch": "selfattn.attention.interop",
    "torch_masks_to_ours": "selfattn.attention.interop",
    "TorchStyleMultiheadAttention": "selfattn.attention.interop",
    "causal_mask": "selfattn.masks",
    "causal_top_left": "selfattn.masks",
    "causal_bottom_right": "selfattn.masks",
    "sliding_window_mask": "selfattn.masks",
    "padding_mask": "selfattn.masks",
    "user_mask": "selfattn.masks",
    "combine_masks": "selfattn.masks",
    "sinusoidal_encoding": "selfattn.positional",
    "LearnedPositionalEmbedding": "selfattn.positional",
    "apply_rope": "selfattn.positional",
    "rope_angles": "selfattn.positional",
    "rope_distance_check": "selfattn.positional",
    "alibi_slopes": "selfattn.positional",
    "alibi_bias": "selfattn.positional",
    "VariantTrace": "selfattn.trace.variants",
    "trace_variant": "selfattn.trace.variants",
    "VARIANTS": "selfattn.trace.variant_names",
    "flash_attention": "selfattn.kernels.flash",
    "attention_probs_from_lse": "selfattn.kernels.probs_from_lse",
    "flex_attention": "selfattn.kernels.flex",
    "flash_attn_func": "selfattn.kernels.flash_attn_api",
    "flash_attn_varlen_func": "selfattn.kernels.flash_attn_api",
    "create_block_mask": "selfattn.masks.block_mask",
    "BlockMask": "selfattn.masks.block_mask",
    "and_masks": "selfattn.masks.block_mask",
    "or_masks": "selfattn.masks.block_mask",
    "ring_attention": "selfattn.distributed.ring",
    "load_pretrained": "selfattn.models",
    "BertModel": "selfattn.models",
    "DecoderModel": "selfattn.models",
    "DecoderConfig": "selfattn.models",
    "ModelOutput": "selfattn.models",
    "Generation": "selfattn.models.generation",
    "TokenChance": "selfattn.models.generation",
    "SelfAttnError": "selfattn.errors",
    "ConfigError": "selfattn.errors",
    "SentenceError": "selfattn.errors",
    "QueryError": "selfattn.errors",
    "EmbeddingError": "selfattn.errors",
    "OptionError": "selfattn.errors",
    "ShapeError": "selfattn.errors",
    "ModelError": "selfattn.errors",
    "DistributedError": "selfattn.errors",
    "TrainingError": "selfattn.errors",
    "train": "selfattn.training",
    "TrainingRun": "selfattn.training",
    "explore": "selfattn.render.visual.notebook",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_names(globals(), _EXPORTS)


# In IPython (Jupyter) the records show as the explorer: the renderer layer registers the
# display, so the records themselves stay plain data (viz.notebook imports no torch).
if "IPython" in sys.modules:
    from selfattn.render.visual.notebook import register as _register_notebook_display

    _register_notebook_display()
