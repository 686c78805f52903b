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
from selfattn.trace.record import AttentionTrace, LayerSteps, Query


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


class ModelTrace:
    """A pretrained model's layer ``layer``, head ``head`` on one sentence.   n tokens, d wide, d_head per head.

    What ``trace_model`` returns: a view of its ``AttentionTrace`` (``record``: every
    layer's every head, and the "model" section) under the names the model walkthrough
    reads, the chosen head's tensors (n, ...) first. Architecture-neutral: the model
    describes its own embedding step (``embedding``) and each layer's attention
    (``attention``: causal, RoPE, grouped-query heads, window), so every renderer reads one
    record for every family.

    Args:
        record: the ``AttentionTrace`` of the model on the sentence, with its "model" section.
    """

    def __init__(self, record: AttentionTrace) -> None:
        self.record = record

    @property
    def _model(self) -> ModelSection:
        return self.record.sections["model"]

    @property
    def _steps(self) -> LayerSteps:
        return self.record.layers[self.record.layer]

    model_name = property(lambda self: self._model.model_name, doc="The model's name.")
    model_source = property(lambda self: self._model.source,
                            doc="What the model was loaded from (a name, folder or hub id).")
    sentence = property(lambda self: self._model.sentence, doc="The text the model read.")
    tokens = property(lambda self: self.record.tokens,
                      doc="The vocabulary's tokens, specials included ([CLS] ... [SEP], <s> ...).")
    readable = property(lambda self: self._model.readable,
                        doc="Each token decoded alone: ' cat' where a byte-level vocabulary writes 'Ġcat'.")
    special_tokens = property(lambda self: self._model.special_tokens,
                              doc="Which of the vocabulary's tokens are special.")
    input_ids = property(lambda self: self._model.input_ids, doc="The token ids.")
    n_layers = property(lambda self: self.record.n_layers, doc="The model's layers.")
    n_heads = property(lambda self: self.record.n_heads, doc="Query heads per layer.")
    d_model = property(lambda self: int(self.record.embeddings.shape[-1]), doc="The hidden states' width d.")
    d_head = property(lambda self: int(self._steps.q.shape[-1]), doc="The width of each head.")
    layer = property(lambda self: self.record.layer, doc="The layer explained, from 0.")
    head = property(lambda self: self.record.head, doc="The head explained, from 0.")
    query_index = property(lambda self: self.record.query.index, doc="The query's 0-based position.")
    embedding = property(lambda self: self._model.embedding, doc="The summands of X0 and their formula.")
    attention = property(lambda self: self._model.infos[self.record.layer],
                         doc="This layer's attention: causal, positions, kv heads, window.")
    layer_infos = property(lambda self: self._model.infos, doc="Per layer, how it attends.")
    embeddings = property(lambda self: self.record.embeddings, doc="(n, d): X0, the first layer's input.")
    hidden_states = property(lambda self: self._model.hidden_states, doc="n_layers + 1 of (n, d).")
    layer_input = property(lambda self: self._model.hidden_states[self.record.layer],
                           doc="(n, d): the hidden state entering layer ``layer``.")
    attention_input = property(lambda self: self._steps.input,
                               doc="(n, d): what the attention reads (LN1(layer_input) pre-LN, layer_input post-LN).")
    layer_output = property(lambda self: self._model.hidden_states[self.record.layer + 1],
                            doc="(n, d): the hidden state leaving layer ``layer`` (the last: after the final norm).")
    q = property(lambda self: self._steps.q[self.record.head],
                 doc="(n, d_head): this head's queries (after RoPE, with RoPE).")
    k = property(lambda self: self._steps.k[self.kv_head],
                 doc="(n, d_head): the keys of the key/value head this head reads.")
    v = property(lambda self: self._steps.v[self.kv_head], doc="(n, d_head): its values.")
    q_plain = property(lambda self: None if self._steps.q_plain is None else self._steps.q_plain[self.record.head],
                       doc="(n, d_head): the queries before RoPE (after a q norm); None without RoPE.")
    k_plain = property(lambda self: None if self._steps.k_plain is None else self._steps.k_plain[self.kv_head],
                       doc="(n, d_head): the keys before RoPE (after a k norm); None without RoPE.")
    scale = property(lambda self: self._steps.scale,
                     doc="The factor on q . k: 1 / sqrt(d_head), or the checkpoint's own (Gemma 3's).")
    allowed = property(lambda self: self._steps.allowed,
                       doc="(n, n) bool: which keys each query may see (causal, window); None: all.")
    scores_plain = property(lambda self: None if self._steps.scores_plain is None else self._steps.scores_plain[self.record.head],
                            doc="(n, n): q_i . k_j before RoPE's turn; None without RoPE.")
    scores_unscaled = property(lambda self: self._steps.scores[self.record.head], doc="(n, n): q_i . k_j.")
    scores = property(lambda self: self._steps.masked[self.record.head],
                      doc="(n, n): scale * q_i . k_j, -inf where not allowed: the softmax input.")
    row_max = property(lambda self: self._steps.row_max[self.record.head], doc="(n,): m, the stable softmax's shift.")
    exp = property(lambda self: self._steps.exp[self.record.head], doc="(n, n): exp(scores - m).")
    exp_sum = property(lambda self: self._steps.exp_sum[self.record.head], doc="(n,): each row of exp summed.")
    weights = property(lambda self: self._steps.weights[self.record.head],
                       doc="(n, n): this head's attention weights.")
    context = property(lambda self: self._steps.context[self.record.head],
                       doc="(n, d_head): weights @ V, this head's output.")
    all_weights = property(lambda self: self.record.all_weights,
                           doc="(n_layers, n_heads, n, n): every head of every layer (a long text's rebuilt from lse).")
    layer_allowed = property(lambda self: self.record.masks,
                             doc="Per layer: (n, n) bool, True = may attend; None: every key.")
    builtin = property(lambda self: self._model.builtin, doc="One of the models selfattn ships or installs.")
    weight_blocks = property(lambda self: self._model.weight_blocks,
                             doc="A GGUF file's block types -> tensors using each; {} for other files.")
    default_model = property(lambda self: self._model.default_model,
                             doc="The model the commands use without --model.")

    @property
    def query_token(self) -> str:
        """The query token, ``tokens[query_index]``."""
        return self.tokens[self.query_index]

    @property
    def query_hidden_states(self) -> torch.Tensor:
        """The query's vector after the embeddings and after each layer.   -> (n_layers + 1, d)"""
        return torch.stack([h[self.query_index] for h in self.hidden_states])  # n_layers + 1 of (d,) -> (L + 1, d)

    @property
    def kv_head(self) -> int:
        """The key/value head this query head reads (itself without grouped-query attention)."""
        return self.attention.kv_head(self.head)

    @property
    def first_token_share(self) -> float:
        """This head's mean weight on token 0 over the queries after it (the "attention sink")."""
        if len(self.tokens) < 2:
            return 1.0
        return float(self.weights[1:, 0].mean())

    @property
    def masks(self) -> tuple[torch.Tensor | None, ...]:
        """Which keys each query may see in every layer: n_layers of (n, n) bool (True = may attend), None: every key."""
        return self.record.masks

    def is_special(self, index: int) -> bool:
        """Whether token ``index`` is one of the vocabulary's special tokens."""
        return self.tokens[index] in self.special_tokens


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
) -> ModelTrace:
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
        The ``ModelTrace``.

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
        return ModelTrace(record)
