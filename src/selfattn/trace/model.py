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

# Longest input each output shows (tokens, [CLS] and [SEP] included). Text shows one
# query row and short vectors, so it goes further than the toy walkthrough's 24.
MAX_MODEL_TOKENS = {"text": 48, "markdown": 48, "json": 512, "html": 512, "plot": 256}


@dataclass
class ModelTrace:
    """A pretrained model's layer ``layer``, head ``head`` on one sentence.   n tokens, d wide, d_head per head.

    Architecture-neutral: the model describes its own embedding step (``embedding``) and
    the layer's attention (``attention``: causal, RoPE, grouped-query heads, window), so
    every renderer reads one record for BERT, GPT-2, Llama, Mistral and Qwen2 alike.
    """

    model_name: str
    sentence: str
    tokens: list[str]  # the vocabulary's tokens, specials included ([CLS] ... [SEP], <s> ...)
    readable: list[str]  # each token decoded alone: ' cat' where a byte-level vocabulary writes 'Ġcat'
    special_tokens: frozenset[str]  # which of the vocabulary's tokens are special
    input_ids: list[int]
    n_layers: int
    n_heads: int
    d_model: int
    d_head: int
    layer: int  # 0-based
    head: int  # 0-based
    query_index: int
    embedding: EmbeddingStep  # the summands of X0 and their formula
    attention: AttentionInfo  # this layer's attention: causal, positions, kv heads, window
    embeddings: torch.Tensor  # (n, d): X0, the first layer's input
    layer_input: torch.Tensor  # (n, d): hidden state entering layer ``layer``
    attention_input: torch.Tensor  # (n, d): what the attention reads: LN1(layer_input) pre-LN, layer_input post-LN
    q: torch.Tensor  # (n, d_head): this head's queries (after RoPE, with RoPE)
    k: torch.Tensor  # (n, d_head): the keys of the key/value head this head reads
    v: torch.Tensor  # (n, d_head)
    q_plain: torch.Tensor | None  # (n, d_head): the queries before RoPE; None without RoPE
    k_plain: torch.Tensor | None  # (n, d_head): the keys before RoPE
    scale: float  # 1 / sqrt(d_head)
    allowed: torch.Tensor | None  # (n, n) bool: which keys each query may see (causal, window); None: all
    scores_unscaled: torch.Tensor  # (n, n): q_i . k_j
    scores: torch.Tensor  # (n, n): scale * q_i . k_j, -inf where not allowed: the softmax input
    row_max: torch.Tensor  # (n,): m, the stable softmax's shift
    exp: torch.Tensor  # (n, n): exp(scores - m)
    exp_sum: torch.Tensor  # (n,)
    weights: torch.Tensor  # (n, n): this head's attention weights
    context: torch.Tensor  # (n, d_head): weights @ V, this head's output
    layer_output: torch.Tensor  # (n, d): hidden state leaving layer ``layer`` (the last: after the final norm)
    hidden_states: tuple[torch.Tensor, ...]  # n_layers + 1 of (n, d)
    all_weights: torch.Tensor  # (n_layers, n_heads, n, n): every head of every layer, each layer's steps
    model_source: str = ""  # what the model was loaded from (a name, folder or hub id)
    layer_allowed: tuple[torch.Tensor | None, ...] = ()  # per layer: (n, n) bool, True = may attend; None: every key
    layer_steps: tuple = ()  # per layer: its block's AttentionSteps on this text (every head's q, k, v, scores, softmax)
    layer_scores_unscaled: tuple[torch.Tensor, ...] = ()  # per layer: (heads, n, n), q_i . k_j before the scaling
    layer_infos: tuple[AttentionInfo, ...] = ()  # per layer: how it attends (causal, window, positions, kv heads)
    builtin: bool = False  # one of the models selfattn ships or installs (trained), not a checkpoint brought in
    default_model: bool = False  # the model the commands use without --model (all-MiniLM-L6-v2)

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
        return self.layer_allowed or (self.allowed,) * self.n_layers

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
    info = model.attention_info(layer)
    kv_head = info.kv_head(head)

    with torch.no_grad():
        out = model.run(encoded, output_attentions=True, output_hidden_states=True)
        layer_input = out.hidden_states[layer]  # (1, n, d)
        block = model.blocks[layer]
        steps = block.attention_steps(layer_input, **model.trace_options())  # one text: no padding
        a = steps.attention
        weights = a.weights[0, head]  # (n, n)
        # Every layer's weights from its own steps, like this head's: the forward pass takes a
        # fused path that rounds differently (~1e-7), and explain and compare must agree exactly.
        every = [
            steps if l == layer else model.blocks[l].attention_steps(out.hidden_states[l], **model.trace_options())
            for l in range(n_layers)
        ]
        all_weights = torch.stack([s.attention.weights[0] for s in every])  # (layers, heads, n, n)
        layer_allowed = tuple(None if s.mask is None else _allowed(s.mask, len(tokens)) for s in every)
        # The model's own forward pass must have used these weights.
        torch.testing.assert_close(all_weights, torch.stack([w[0] for w in out.attentions]), rtol=0, atol=1e-5)
        q, k, v = steps.q[0, head], steps.k[0, kv_head], steps.v[0, kv_head]  # (n, d_head) each
        rope = steps.q_plain is not None
        allowed = layer_allowed[layer]
        attention_input = block.norm1(layer_input) if block.config.norm_first else layer_input
        return ModelTrace(
            model_name=model.name,
            sentence=sentence,
            tokens=tokens,
            readable=readable,
            special_tokens=special,
            input_ids=ids[0].tolist(),
            n_layers=n_layers,
            n_heads=n_heads,
            d_model=layer_input.shape[-1],
            d_head=q.shape[-1],
            layer=layer,
            head=head,
            query_index=query_index,
            embedding=model.embedding_step(ids),
            attention=info,
            embeddings=out.hidden_states[0][0],
            layer_input=layer_input[0],
            attention_input=attention_input[0],
            q=q,
            k=k,
            v=v,
            q_plain=steps.q_plain[0, head] if rope else None,
            k_plain=steps.k_plain[0, kv_head] if rope else None,
            scale=a.scale,
            allowed=allowed,
            scores_unscaled=attention_scores(q, k),  # (n, n): q_i . k_j before the scaling
            scores=a.masked_scores[0, head],
            row_max=a.softmax.shift[0, head, :, 0],
            exp=a.softmax.exp[0, head],
            exp_sum=a.softmax.total[0, head, :, 0],
            weights=weights,
            context=a.output[0, head],
            layer_output=out.hidden_states[layer + 1][0],
            hidden_states=tuple(h[0] for h in out.hidden_states),
            all_weights=all_weights,
            model_source=os.fspath(model.name if source is None else source),
            layer_allowed=layer_allowed,
            layer_steps=tuple(every),
            layer_scores_unscaled=tuple(_unscaled(s, model.attention_info(l)) for l, s in enumerate(every)),
            layer_infos=tuple(model.attention_info(l) for l in range(n_layers)),
            builtin=model.name in MODELS,
            default_model=model.name == DEFAULT_MODEL,
        )


def _allowed(mask: torch.Tensor, n: int) -> torch.Tensor:
    """The (n, n) bool of the keys each query may see, from the mask the attention applied."""
    if mask.dtype == torch.bool:
        return mask.reshape(-1, n, n)[0].clone()
    return torch.isfinite(mask.reshape(-1, n, n)[0])


def _unscaled(steps, info: AttentionInfo) -> torch.Tensor:
    """Every head's q_i . k_j before the scaling, each query head with the key/value head it reads.   -> (H, n, n)"""
    q, k = steps.q[0], steps.k[0]  # (H, n, d_head), (K, n, d_head)
    return torch.stack([attention_scores(q[h], k[info.kv_head(h)]) for h in range(q.shape[0])])  # H of (n, n)
