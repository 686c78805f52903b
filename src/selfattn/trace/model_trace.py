"""One head of a pretrained model on one sentence, with every intermediate recorded.

The same walk as the seed's, on real learned numbers: the model's tokens, its embedding
step, the chosen layer's input, that head's Q, K and V (and RoPE's turn of them), the
scores, the mask, the scaling, the softmax and the context vectors. Everything comes from
running the model (``run``) and the layer's own ``attention_steps`` (on a long text the
other layers' rows come through the tiled kernel: ``model_layers``); nothing here
computes attention a second way. Encoders and decoders alike: the model describes
itself (``embedding_step``, ``attention_info``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from selfattn.errors import OptionError, SentenceError
from selfattn.models.description import AttentionInfo, EmbeddingStep
from selfattn.models.files import DEFAULT_MODEL, MODELS
from selfattn.models.queries import find_model_query
from selfattn.trace.model_layers import FULL_TRACE_CELLS, chosen_layer_in_full, every_layer_in_full
from selfattn.trace.record import AttentionTrace, Query


@dataclass(frozen=True)
class ModelSection:
    """What a model's trace has more than a toy's: the model, its tokens as they read, its embedding step.

    Attributes:
        model_name: the model's name.
        source: what it was loaded from (a name, folder or hub id).
        sentence: the text it read.
        readable: each token decoded alone (' cat' where a byte-level vocabulary writes 'Ġcat').
        special_tokens: which of the vocabulary's tokens are special.
        input_ids: the token ids.
        embedding: the summands of X0 and their formula (``EmbeddingStep``).
        infos: per layer, how it attends (``AttentionInfo``: causal, window, positions, kv heads).
        hidden_states: n_layers + 1 of (n, d): X0, then each layer's output (the last after the final norm).
        builtin: one of the models selfattn ships or installs (trained), not a checkpoint brought in.
        default_model: the model the commands use without --model (all-MiniLM-L6-v2).
        weight_blocks: a GGUF file's block types ("Q4_1", "Q8_0", "F32", ...) -> how many
            tensors use each; empty for other files.
    """

    model_name: str
    source: str
    sentence: str
    readable: list[str]
    special_tokens: frozenset[str]
    input_ids: list[int]
    embedding: EmbeddingStep
    infos: tuple[AttentionInfo, ...]
    hidden_states: tuple[torch.Tensor, ...]
    builtin: bool = False
    default_model: bool = False
    weight_blocks: dict = field(default_factory=dict)


ModelTrace = AttentionTrace
"""The old name of what ``trace_model`` returns (it was a view of the record; now the record itself)."""


def check_layer_head(layer: int, head: int, n_layers: int, n_heads: int) -> None:
    for flag, value, count in (("--layer", layer, n_layers), ("--head", head, n_heads)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < count:
            raise OptionError(f"{flag} must be from 0 to {count - 1} for this model, got {value!r}")


def trace_model(
    sentence: str,
    model,
    *,
    layer: int = 0,
    head: int = 0,
    query: str | int | None = None,
    source: str | os.PathLike | None = None,
    every_layer: bool | None = None,
) -> AttentionTrace:
    """Run a loaded model on ``sentence`` and record layer ``layer``, head ``head`` for the query.

    Any supported family: the model describes its embedding step and attention, and each
    block's own ``attention_steps`` records its heads (causal mask, RoPE, the key/value head
    a query head reads under grouped-query attention, the window). Every layer's attention
    description is kept, and its steps, so the renderers never run the model again: on a
    short text every layer's whole steps; on a long one (more than ``FULL_TRACE_CELLS``
    layers x heads x n x n) the chosen layer's whole steps and every other layer's
    ``LayerRows`` (q, k, v, context and the softmax's lse, each row of its weights rebuilt
    exactly when asked for), taken a layer at a time through the tiled kernel.

    Args:
        sentence: the text, not empty.
        model: a loaded ``BertModel`` or ``DecoderModel`` (``load_pretrained``).
        layer: the layer to explain, from 0.
        head: the head to explain, from 0.
        query: the query token or its 0-based position, a negative one counted from the end
            (-1: the last token); None: the model's default.
        source: what the model was loaded from, recorded in the trace (default: its name).
        every_layer: keep every layer's whole steps (True) or the chosen layer's only
            (False); None: every layer's while they fit ``FULL_TRACE_CELLS``.

    Returns:
        The record (``AttentionTrace``): every layer's steps, the chosen ``layer`` and
            ``head``, and the "model" section (``ModelSection``: the tokens as they read, the
            embedding step, each layer's ``AttentionInfo``, the hidden states).

    Raises:
        SentenceError: the sentence is empty, or has more tokens than the model has
            positions (the model's own tokenizer says so); any length within them is traced.
        QueryError: the query is not one of the model's tokens, or out of range.
        OptionError: the layer or head is out of range.
    """
    if not isinstance(sentence, str) or not sentence.strip():
        raise SentenceError("the sentence is empty: give at least one word")
    n_layers, n_heads = len(model.blocks), model.attention_info(0).n_heads
    check_layer_head(layer, head, n_layers, n_heads)
    encoded = model.tokenize(sentence)
    tokens = encoded.tokens[0]
    ids = encoded.input_ids  # (1, n)
    special = model.tokenizer.special_tokens
    readable = model.tokenizer.readable(ids[0].tolist())
    query_index = find_model_query(tokens, query, readable, special)
    n = len(tokens)
    if every_layer is None:
        every_layer = n_layers * n_heads * n * n <= FULL_TRACE_CELLS
    with torch.no_grad():
        if every_layer:
            hidden_states, layers = every_layer_in_full(model, encoded, n)
        else:
            hidden_states, layers = chosen_layer_in_full(model, encoded, n, layer)
        infos = tuple(model.attention_info(l) for l in range(n_layers))
        section = ModelSection(
            model_name=model.name,
            source=os.fspath(model.name if source is None else source),
            sentence=sentence,
            readable=readable,
            special_tokens=special,
            input_ids=ids[0].tolist(),
            embedding=model.embedding_step(ids),
            infos=infos,
            hidden_states=tuple(h[0] for h in hidden_states),
            builtin=model.name in MODELS,
            default_model=model.name == DEFAULT_MODEL,
            weight_blocks=dict(getattr(model, "gguf_types", {}) or {}),
        )
        record = AttentionTrace(tokens, Query(query_index, tokens[query_index]), hidden_states[0][0], layers,
                                layer=layer, head=head, sections={"model": section})
        return record
