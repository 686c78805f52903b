"""One head of a pretrained model on one sentence, with every intermediate recorded.

The same walk as the seed's, on real learned numbers: the model's tokens, its embedding
step, the chosen layer's input, that head's Q, K and V (and RoPE's turn of them), the
scores, the mask, the scaling, the softmax and the context vectors. Everything comes from
running the model (``run``) and the layer's own ``attention_steps``; nothing here
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
from selfattn.pipeline.steps import attention_scores
from selfattn.models.queries import find_model_query
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
                           doc="(n_layers, n_heads, n, n): every head of every layer, each layer's steps.")
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
) -> ModelTrace:
    """Run a loaded model on ``sentence`` and record layer ``layer``, head ``head`` for the query.

    Any supported family: the model describes its embedding step and attention, and each
    block's own ``attention_steps`` records its heads (causal mask, RoPE, the key/value head
    a query head reads under grouped-query attention, the window). Every layer's steps and
    attention description are kept, so the renderers never run the model again.

    Args:
        sentence: the text, not empty.
        model: a loaded ``BertModel`` or ``DecoderModel`` (``load_pretrained``).
        layer: the layer to explain, from 0.
        head: the head to explain, from 0.
        query: the query token or its 0-based position, a negative one counted from the end
            (-1: the last token); None: the model's default.
        source: what the model was loaded from, recorded in the trace (default: its name).

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
    with torch.no_grad():
        out = model.run(encoded, output_attentions=True, output_hidden_states=True)
        # Every layer's steps from its own block: the forward pass takes a fused path that rounds
        # differently (~1e-7), and explain and compare must agree exactly.
        every = [model.blocks[l].attention_steps(out.hidden_states[l], **model.trace_options()) for l in range(n_layers)]
        # The model's own forward pass must have used these weights (a layer at a time: no stacked copies).
        for steps, weights in zip(every, out.attentions, strict=True):
            torch.testing.assert_close(steps.attention.weights[0], weights[0], rtol=0, atol=1e-5)
        infos = tuple(model.attention_info(l) for l in range(n_layers))
        layers = tuple(_layer_steps(model, l, s, infos[l], out.hidden_states, len(tokens)) for l, s in enumerate(every))
        section = ModelSection(
            model_name=model.name,
            source=os.fspath(model.name if source is None else source),
            sentence=sentence,
            readable=readable,
            special_tokens=special,
            input_ids=ids[0].tolist(),
            embedding=model.embedding_step(ids),
            infos=infos,
            hidden_states=tuple(h[0] for h in out.hidden_states),
            builtin=model.name in MODELS,
            default_model=model.name == DEFAULT_MODEL,
            weight_blocks=dict(getattr(model, "gguf_types", {}) or {}),
        )
        record = AttentionTrace(tokens, Query(query_index, tokens[query_index]), out.hidden_states[0][0], layers,
                                layer=layer, head=head, sections={"model": section})
        return ModelTrace(record)


def _allowed(mask: torch.Tensor, n: int) -> torch.Tensor:
    """The (n, n) bool of the keys each query may see, from the mask the attention applied."""
    if mask.dtype == torch.bool:
        return mask.reshape(-1, n, n)[0].clone()
    return torch.isfinite(mask.reshape(-1, n, n)[0])


def _per_head_scores(q: torch.Tensor, k: torch.Tensor, info: AttentionInfo) -> torch.Tensor:
    """q_i . k_j for every query head and the key/value head it reads.   (H, n, d_head), (K, n, d_head) -> (H, n, n)"""
    return torch.stack([attention_scores(q[h], k[info.kv_head(h)]) for h in range(q.shape[0])])  # H of (n, n)


def _layer_steps(model, layer: int, steps, info: AttentionInfo, hidden_states, n: int) -> LayerSteps:
    """One layer's ``AttentionSteps`` (a batch of one text) as the record's ``LayerSteps``, every head."""
    a, block = steps.attention, model.blocks[layer]
    x = hidden_states[layer]  # (1, n, d): the hidden state entering the layer
    return LayerSteps(
        input=(block.norm1(x) if block.config.norm_first else x)[0],  # what the attention reads
        q=steps.q[0],
        k=steps.k[0],
        v=steps.v[0],
        q_plain=None if steps.q_plain is None else steps.q_plain[0],
        k_plain=None if steps.k_plain is None else steps.k_plain[0],
        kv_head_of=tuple(info.kv_head(h) for h in range(steps.q.shape[1])),
        scale=a.scale,
        scores=_per_head_scores(steps.q[0], steps.k[0], info),  # before the scaling
        scaled=a.scores[0],
        masked=a.masked_scores[0],
        row_max=a.softmax.shift[0, :, :, 0],
        exp=a.softmax.exp[0],
        exp_sum=a.softmax.total[0, :, :, 0],
        weights=a.weights[0],
        context=a.output[0],
        allowed=None if steps.mask is None else _allowed(steps.mask, n),
        output=hidden_states[layer + 1][0],
        scores_plain=None if steps.q_plain is None else _per_head_scores(steps.q_plain[0], steps.k_plain[0], info),
    )
