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
from dataclasses import dataclass

import torch

from selfattn.errors import OptionError, SentenceError
from selfattn.models.description import AttentionInfo, EmbeddingStep
from selfattn.models.files import DEFAULT_MODEL, MODELS
from selfattn.pipeline.steps import attention_scores
from selfattn.models.queries import find_model_query
from selfattn.trace.record import AttentionTrace, LayerSteps, Query

# Longest input each output shows (tokens, [CLS] and [SEP] included). Text shows one
# query row and short vectors, so it goes further than the toy walkthrough's 24.
MAX_MODEL_TOKENS = {"text": 48, "markdown": 48, "json": 512, "html": 512, "plot": 256}


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

    @property
    def model_name(self) -> str:
        """The model's name."""
        return self._model.model_name

    @property
    def model_source(self) -> str:
        """What the model was loaded from (a name, folder or hub id)."""
        return self._model.source

    @property
    def sentence(self) -> str:
        """The text the model read."""
        return self._model.sentence

    @property
    def tokens(self) -> list[str]:
        """The vocabulary's tokens, specials included ([CLS] ... [SEP], <s> ...)."""
        return self.record.tokens

    @property
    def readable(self) -> list[str]:
        """Each token decoded alone: ' cat' where a byte-level vocabulary writes 'Ġcat'."""
        return self._model.readable

    @property
    def special_tokens(self) -> frozenset[str]:
        """Which of the vocabulary's tokens are special."""
        return self._model.special_tokens

    @property
    def input_ids(self) -> list[int]:
        """The token ids."""
        return self._model.input_ids

    @property
    def n_layers(self) -> int:
        """The model's layers."""
        return self.record.n_layers

    @property
    def n_heads(self) -> int:
        """Query heads per layer."""
        return self.record.n_heads

    @property
    def d_model(self) -> int:
        """The hidden states' width d."""
        return int(self.record.embeddings.shape[-1])

    @property
    def d_head(self) -> int:
        """The width of each head."""
        return int(self._steps.q.shape[-1])

    @property
    def layer(self) -> int:
        """The layer explained, from 0."""
        return self.record.layer

    @property
    def head(self) -> int:
        """The head explained, from 0."""
        return self.record.head

    @property
    def query_index(self) -> int:
        """The query's 0-based position."""
        return self.record.query.index

    @property
    def embedding(self) -> EmbeddingStep:
        """The summands of X0 and their formula."""
        return self._model.embedding

    @property
    def attention(self) -> AttentionInfo:
        """This layer's attention: causal, positions, kv heads, window."""
        return self._model.infos[self.record.layer]

    @property
    def layer_infos(self) -> tuple[AttentionInfo, ...]:
        """Per layer, how it attends."""
        return self._model.infos

    @property
    def embeddings(self) -> torch.Tensor:
        """(n, d): X0, the first layer's input."""
        return self.record.embeddings

    @property
    def hidden_states(self) -> tuple[torch.Tensor, ...]:
        """n_layers + 1 of (n, d)."""
        return self._model.hidden_states

    @property
    def layer_input(self) -> torch.Tensor:
        """(n, d): the hidden state entering layer ``layer``."""
        return self._model.hidden_states[self.record.layer]

    @property
    def attention_input(self) -> torch.Tensor:
        """(n, d): what the attention reads (LN1(layer_input) pre-LN, layer_input post-LN)."""
        return self._steps.input

    @property
    def layer_output(self) -> torch.Tensor:
        """(n, d): the hidden state leaving layer ``layer`` (the last: after the final norm)."""
        return self._model.hidden_states[self.record.layer + 1]

    @property
    def q(self) -> torch.Tensor:
        """(n, d_head): this head's queries (after RoPE, with RoPE)."""
        return self._steps.q[self.record.head]

    @property
    def k(self) -> torch.Tensor:
        """(n, d_head): the keys of the key/value head this head reads."""
        return self._steps.k[self.kv_head]

    @property
    def v(self) -> torch.Tensor:
        """(n, d_head): its values."""
        return self._steps.v[self.kv_head]

    @property
    def q_plain(self) -> torch.Tensor | None:
        """(n, d_head): the queries before RoPE; None without RoPE."""
        return None if self._steps.q_plain is None else self._steps.q_plain[self.record.head]

    @property
    def k_plain(self) -> torch.Tensor | None:
        """(n, d_head): the keys before RoPE; None without RoPE."""
        return None if self._steps.k_plain is None else self._steps.k_plain[self.kv_head]

    @property
    def scale(self) -> float:
        """1 / sqrt(d_head)."""
        return self._steps.scale

    @property
    def allowed(self) -> torch.Tensor | None:
        """(n, n) bool: which keys each query may see (causal, window); None: all."""
        return self._steps.allowed

    @property
    def scores_unscaled(self) -> torch.Tensor:
        """(n, n): q_i . k_j."""
        return self._steps.scores[self.record.head]

    @property
    def scores(self) -> torch.Tensor:
        """(n, n): scale * q_i . k_j, -inf where not allowed: the softmax input."""
        return self._steps.masked[self.record.head]

    @property
    def row_max(self) -> torch.Tensor:
        """(n,): m, the stable softmax's shift."""
        return self._steps.row_max[self.record.head]

    @property
    def exp(self) -> torch.Tensor:
        """(n, n): exp(scores - m)."""
        return self._steps.exp[self.record.head]

    @property
    def exp_sum(self) -> torch.Tensor:
        """(n,): each row of exp summed."""
        return self._steps.exp_sum[self.record.head]

    @property
    def weights(self) -> torch.Tensor:
        """(n, n): this head's attention weights."""
        return self._steps.weights[self.record.head]

    @property
    def context(self) -> torch.Tensor:
        """(n, d_head): weights @ V, this head's output."""
        return self._steps.context[self.record.head]

    @property
    def all_weights(self) -> torch.Tensor:
        """(n_layers, n_heads, n, n): every head of every layer, each layer's steps."""
        return self.record.all_weights

    @property
    def layer_allowed(self) -> tuple[torch.Tensor | None, ...]:
        """Per layer: (n, n) bool, True = may attend; None: every key."""
        return self.record.masks

    @property
    def builtin(self) -> bool:
        """One of the models selfattn ships or installs."""
        return self._model.builtin

    @property
    def default_model(self) -> bool:
        """The model the commands use without --model."""
        return self._model.default_model

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
    output_format: str = "text",
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
        query: the query token or its 0-based position; None: the model's default.
        output_format: what the trace is for ("text", "markdown", "json", "html", "plot"):
            sets the longest input.
        source: what the model was loaded from, recorded in the trace (default: its name).

    Returns:
        The ``ModelTrace``.
    """
    if not isinstance(sentence, str) or not sentence.strip():
        raise SentenceError("the sentence is empty: give at least one word")
    n_layers, n_heads = len(model.blocks), model.attention_info(0).n_heads
    check_layer_head(layer, head, n_layers, n_heads)
    encoded = model.tokenize(sentence)
    tokens = encoded.tokens[0]
    limit = MAX_MODEL_TOKENS.get(output_format, 512)
    if len(tokens) > limit:
        hint = f" (use --format json for up to {MAX_MODEL_TOKENS['json']})" if limit < MAX_MODEL_TOKENS["json"] else ""
        raise SentenceError(
            f"the sentence has {len(tokens)} tokens (special tokens included); "
            f"{output_format} output shows at most {limit}{hint}"
        )
    ids = encoded.input_ids  # (1, n)
    special = model.tokenizer.special_tokens
    readable = model.tokenizer.readable(ids[0].tolist())
    query_index = find_model_query(tokens, query, readable, special)
    with torch.no_grad():
        out = model.run(encoded, output_attentions=True, output_hidden_states=True)
        # Every layer's steps from its own block: the forward pass takes a fused path that rounds
        # differently (~1e-7), and explain and compare must agree exactly.
        every = [model.blocks[l].attention_steps(out.hidden_states[l], **model.trace_options()) for l in range(n_layers)]
        all_weights = torch.stack([s.attention.weights[0] for s in every])  # (layers, heads, n, n)
        # The model's own forward pass must have used these weights.
        torch.testing.assert_close(all_weights, torch.stack([w[0] for w in out.attentions]), rtol=0, atol=1e-5)
        layers = tuple(_layer_steps(model, l, s, out.hidden_states, len(tokens)) for l, s in enumerate(every))
        section = ModelSection(
            model_name=model.name,
            source=os.fspath(model.name if source is None else source),
            sentence=sentence,
            readable=readable,
            special_tokens=special,
            input_ids=ids[0].tolist(),
            embedding=model.embedding_step(ids),
            infos=tuple(model.attention_info(l) for l in range(n_layers)),
            hidden_states=tuple(h[0] for h in out.hidden_states),
            builtin=model.name in MODELS,
            default_model=model.name == DEFAULT_MODEL,
        )
        record = AttentionTrace(tokens, Query(query_index, tokens[query_index]), out.hidden_states[0][0], layers,
                                layer=layer, head=head, sections={"model": section})
        return ModelTrace(record)


def _allowed(mask: torch.Tensor, n: int) -> torch.Tensor:
    """The (n, n) bool of the keys each query may see, from the mask the attention applied."""
    if mask.dtype == torch.bool:
        return mask.reshape(-1, n, n)[0].clone()
    return torch.isfinite(mask.reshape(-1, n, n)[0])


def _unscaled(steps, info: AttentionInfo) -> torch.Tensor:
    """Every head's q_i . k_j before the scaling, each query head with the key/value head it reads.   -> (H, n, n)"""
    q, k = steps.q[0], steps.k[0]  # (H, n, d_head), (K, n, d_head)
    return torch.stack([attention_scores(q[h], k[info.kv_head(h)]) for h in range(q.shape[0])])  # H of (n, n)


def _layer_steps(model, layer: int, steps, hidden_states, n: int) -> LayerSteps:
    """One layer's ``AttentionSteps`` (a batch of one text) as the record's ``LayerSteps``, every head."""
    a, info, block = steps.attention, model.attention_info(layer), model.blocks[layer]
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
        scores=_unscaled(steps, info),
        scaled=a.scores[0],
        masked=a.masked_scores[0],
        row_max=a.softmax.shift[0, :, :, 0],
        exp=a.softmax.exp[0],
        exp_sum=a.softmax.total[0, :, :, 0],
        weights=a.weights[0],
        context=a.output[0],
        allowed=None if steps.mask is None else _allowed(steps.mask, n),
        output=hidden_states[layer + 1][0],
    )
