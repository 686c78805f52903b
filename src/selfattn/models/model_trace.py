"""One head of a pretrained model on one sentence, with every intermediate recorded.

The same walk as the seed's, on real learned numbers: WordPiece tokens, the embedding
layer's vectors, the chosen layer's input, that head's Q, K and V, the scores, the
scaling, the softmax and the context vectors. Everything comes from running the model
(``BertModel.run``) and the layer's own ``MultiHeadAttention.steps``; nothing here
computes attention a second way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from selfattn.errors import OptionError, QueryError, SentenceError
from selfattn.models.loading import shared_model
from selfattn.pipeline.steps import attention_scores
from selfattn.pipeline.tokenize import find_query, quote_tokens

SPECIAL_TOKENS = ("[CLS]", "[SEP]", "[PAD]")
# Longest input each output shows (tokens, [CLS] and [SEP] included). Text shows one
# query row and short vectors, so it goes further than the toy walkthrough's 24.
MAX_MODEL_TOKENS = {"text": 48, "markdown": 48, "json": 512, "html": 512, "plot": 256}


@dataclass
class ModelTrace:
    """A pretrained model's layer ``layer``, head ``head`` on one sentence.   n tokens, d wide, d_h per head."""

    model_name: str
    sentence: str
    tokens: list[str]  # WordPiece tokens, [CLS] first and [SEP] last
    input_ids: list[int]
    n_layers: int
    n_heads: int
    d_model: int
    head_dim: int
    layer: int  # 0-based
    head: int  # 0-based
    query_index: int
    word_embeddings: torch.Tensor  # (n, d): E_word[id] of each token
    position_embeddings: torch.Tensor  # (n, d): E_pos[i]
    type_embedding: torch.Tensor  # (d,): E_type[0], the same for every token of one text
    embeddings: torch.Tensor  # (n, d): LN(word + type + position), the encoder's input
    layer_input: torch.Tensor  # (n, d): hidden state entering layer ``layer``
    q: torch.Tensor  # (n, d_h): this head's queries
    k: torch.Tensor  # (n, d_h)
    v: torch.Tensor  # (n, d_h)
    scale: float  # 1 / sqrt(d_h)
    scores_unscaled: torch.Tensor  # (n, n): q_i . k_j
    scores: torch.Tensor  # (n, n): scale * q_i . k_j, the softmax input (no mask for one text)
    row_max: torch.Tensor  # (n,): m, the stable softmax's shift
    exp: torch.Tensor  # (n, n): exp(scores - m)
    exp_sum: torch.Tensor  # (n,)
    weights: torch.Tensor  # (n, n): this head's attention weights
    context: torch.Tensor  # (n, d_h): weights @ V, this head's output
    layer_output: torch.Tensor  # (n, d): hidden state leaving layer ``layer``
    hidden_states: tuple[torch.Tensor, ...]  # n_layers + 1 of (n, d)
    all_weights: torch.Tensor  # (n_layers, n_heads, n, n): every head of every layer, each layer's steps

    @property
    def query_token(self) -> str:
        """The query token, ``tokens[query_index]``."""
        return self.tokens[self.query_index]

    @property
    def query_hidden_states(self) -> torch.Tensor:
        """The query's vector after the embeddings and after each layer.   -> (n_layers + 1, d)"""
        return torch.stack([h[self.query_index] for h in self.hidden_states])  # n_layers + 1 of (d,) -> (L + 1, d)

    def _repr_html_(self) -> str:
        """Jupyter shows a model trace as the interactive explorer."""
        from selfattn.viz.explorer import notebook_explorer

        return notebook_explorer(self)


def default_model_query(tokens: list[str]) -> int:
    """The seed's choice, past [CLS]: the second word piece ('cat'), or the first for a one-token text."""
    return 2 if len(tokens) > 3 else 1


def find_model_query(tokens: list[str], query: str | int | None) -> int:
    """A query given as a WordPiece token (any case: the model lower-cases) or a 0-based position."""
    if query is None:
        return default_model_query(tokens)
    if isinstance(query, str) and query not in tokens:
        lowered = [t if t in SPECIAL_TOKENS else t.lower() for t in tokens]
        if query.lower() in lowered:
            return lowered.index(query.lower())
    try:
        return find_query(tokens, query)
    except QueryError as error:
        if isinstance(query, str) and "not in the sentence" in str(error):
            raise QueryError(
                f"query token {query!r} is not among the model's WordPiece tokens: choose one of "
                f"{quote_tokens(tokens, 12, count=True)} (any case) or a 0-based position ([CLS] is 0)"
            ) from None
        raise


def model_query_piece(query: str, sentences: list[list[str]], split) -> str:
    """A query word as the model's tokenizer writes it, when it is no token of some sentence.

    'Café' becomes 'cafe'; a word the tokenizer cuts into several pieces is refused with
    the pieces named, since no single token of a sentence is that word. ``split`` turns a
    text into its WordPiece tokens without [CLS] and [SEP]; a query found in every
    sentence, or already a "##" piece, is returned as it is.

    Args:
        query: the query as given, a word (not a position).
        sentences: the WordPiece tokens of each sentence.
        split: text -> its WordPiece tokens, without [CLS] and [SEP].

    Returns:
        The query, or the one piece the tokenizer makes of it.

    Raises:
        QueryError: the tokenizer cuts the query into several pieces (named in the message).
    """
    try:
        for tokens in sentences:
            find_model_query(tokens, query)
        return query
    except QueryError:
        if query.startswith("##"):
            return query
    pieces = split(query)
    if len(pieces) > 1:
        raise QueryError(
            f"the model cuts the query {query!r} into {len(pieces)} WordPiece tokens "
            f"({', '.join(repr(p) for p in pieces)}): give one of them, e.g. {pieces[0]!r}, or a 0-based position"
        )
    return pieces[0] if pieces else query


def check_layer_head(layer: int, head: int, n_layers: int, n_heads: int) -> None:
    for flag, value, count in (("--layer", layer, n_layers), ("--head", head, n_heads)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < count:
            raise OptionError(f"{flag} must be from 0 to {count - 1} for this model, got {value!r}")


def trace_model(
    sentence: str,
    model_name: str = "all-MiniLM-L6-v2",
    *,
    layer: int = 0,
    head: int = 0,
    query: str | int | None = None,
    output_format: str = "text",
) -> ModelTrace:
    """Run the model on ``sentence`` and record layer ``layer``, head ``head`` for the query."""
    if not isinstance(sentence, str) or not sentence.strip():
        raise SentenceError("the sentence is empty: give at least one word")
    model = shared_model(model_name)
    config = model.config
    check_layer_head(layer, head, config.num_hidden_layers, config.num_attention_heads)
    encoded = model.tokenize(sentence)
    tokens = encoded.tokens[0]
    limit = MAX_MODEL_TOKENS.get(output_format, 512)
    if len(tokens) > limit:
        hint = f" (use --format json for up to {MAX_MODEL_TOKENS['json']})" if limit < MAX_MODEL_TOKENS["json"] else ""
        raise SentenceError(
            f"the sentence has {len(tokens)} WordPiece tokens ([CLS] and [SEP] included); "
            f"{output_format} output shows at most {limit}{hint}"
        )
    query_index = find_model_query(tokens, query)

    with torch.no_grad():
        out = model.run(encoded, output_attentions=True, output_hidden_states=True)
        ids = encoded.input_ids  # (1, n)
        emb = model.embeddings
        positions = torch.arange(ids.shape[1])
        block = model.encoder.layers[layer]
        layer_input = out.hidden_states[layer]  # (1, n, d)
        steps = block.attention.steps(layer_input)  # one text: no padding, no mask
        a = steps.attention
        weights = a.weights[0, head]  # (n, n)
        # Every layer's weights from its own steps, like this head's: the forward pass takes a
        # fused path that rounds differently (~1e-7), and explain and compare must agree exactly.
        all_weights = torch.stack([
            (steps if l == layer else model.encoder.layers[l].attention.steps(out.hidden_states[l])).attention.weights[0]
            for l in range(config.num_hidden_layers)
        ])  # (layers, heads, n, n)
        # The model's own forward pass must have used these weights.
        torch.testing.assert_close(all_weights, torch.stack([w[0] for w in out.attentions]), rtol=0, atol=1e-5)
        q, k, v = steps.q[0, head], steps.k[0, head], steps.v[0, head]  # (n, d_h) each
        return ModelTrace(
            model_name=model.name,
            sentence=sentence,
            tokens=tokens,
            input_ids=ids[0].tolist(),
            n_layers=config.num_hidden_layers,
            n_heads=config.num_attention_heads,
            d_model=config.hidden_size,
            head_dim=q.shape[-1],
            layer=layer,
            head=head,
            query_index=query_index,
            word_embeddings=emb.word(ids)[0],
            position_embeddings=emb.position(positions),
            type_embedding=emb.token_type.weight[0].clone(),
            embeddings=out.hidden_states[0][0],
            layer_input=layer_input[0],
            q=q,
            k=k,
            v=v,
            scale=a.scale,
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
        )
