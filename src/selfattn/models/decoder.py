"""A decoder-only language model (GPT-2, Llama, Mistral, Qwen2, Qwen3, Gemma 3) built from our own modules.

    X0   = E_tok[ids] (+ E_pos[positions] for GPT-2's learned positions)      (batch, seq, d)
           (times sqrt(d) where the family scales its embeddings: Gemma)
    X_l  = PreLN-Block_l(X_{l-1}),  l = 1 .. L      causal attention (RoPE / window / GQA per config)
    logits = Norm(X_L) W_out^T                     W_out = E_tok when the embeddings are tied

Every block is our ``TransformerBlock``: ``MultiHeadAttention`` (causal, grouped-query,
RoPE with the checkpoint's frequencies and its layer's base, the sliding window of its
layer, q/k norms and the score scale where the family has them), LayerNorm or RMSNorm
(gain w or 1 + w, sandwich norms around attention and feed-forward for Gemma), and GELU,
SwiGLU or GeGLU. What differs between families is only data: the ``DecoderConfig`` each
family reads from its config.json, and its weight-name table.

Padding: a batch is padded on the left (``TextTokenizer(padding_side="left")``) and each
row's positions count from its first real token (cumsum of the attention mask), so a
padded row computes what it would alone; padding keys get exactly zero weight. A padding
query may see itself, so that its row (unused) stays finite.
"""

from __future__ import annotations

import torch
from torch import nn

from selfattn.attention.kv_cache import KVCache
from selfattn.attention.norm_and_mlp import make_norm
from selfattn.attention.transformer import TransformerBlock
from selfattn.errors import ModelError, SentenceError, ShapeError
from selfattn.models.decoder_config import DecoderConfig
from selfattn.models.description import AttentionInfo, EmbeddingPart, EmbeddingStep, attention_info
from selfattn.models.model_output import ModelOutput
from selfattn.models.tokenizer import Encoded, TextTokenizer, as_text_list
from selfattn.positional.rope import rope_rotation


class DecoderModel(nn.Module):
    """A pretrained decoder: texts or ids in, next-token logits, hidden states and attention out.

    ``model(texts_or_ids, output_attentions=True, output_hidden_states=True)`` -> ModelOutput
    with ``logits`` (batch, seq, vocab); ``model.generate(...)`` continues texts.
    Usually made by ``selfattn.load_pretrained``, which copies in the checkpoint's
    weights, freezes them and switches to eval mode.

    Args:
        config: the network's sizes and choices (``DecoderConfig``).
        tokenizer: the model's tokenizer, padding on the left; None: only ids work.
        name: the model's name, copied into every output.
    """

    def __init__(self, config: DecoderConfig, tokenizer: TextTokenizer | None = None, name: str = "decoder") -> None:
        super().__init__()
        self.config = config
        self.tokenizer = tokenizer
        self.name = name
        self.chat_template: str | None = None  # the model's Jinja chat template, when it was tuned for chat
        self.gguf_types: dict[str, int] = {}  # a GGUF file's block types (Q4_1, ...) -> tensors; {} for other files
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.position = nn.Embedding(config.max_positions, config.d_model) if config.positional == "learned" else None
        self.layers = nn.ModuleList(TransformerBlock(config.block(i)) for i in range(config.n_layers))
        self.norm = make_norm(config.block(0))
        self.lm_head = None if config.tie_embeddings else nn.Linear(config.d_model, config.vocab_size, bias=False)

    @property
    def output_matrix(self) -> torch.Tensor:
        """W_out, (vocab, d): the token embedding when tied."""
        return self.embed.weight if self.lm_head is None else self.lm_head.weight

    @property
    def blocks(self):
        """The decoder's ``TransformerBlock``s, in order."""
        return self.layers

    def embedding_step(self, input_ids: torch.Tensor) -> EmbeddingStep:
        """The summands of X0 for one text, (1, n) ids -> ``EmbeddingStep`` (for the trace).

        Args:
            input_ids: one text's ids, (1, n).

        Returns:
            The token vectors (and GPT-2's position vectors), (n, d) each, and the formula.
        """
        n = input_ids.shape[1]
        parts = [EmbeddingPart("word", "E_tok[id]", self.embed(input_ids)[0])]
        scaled, d = self.config.scale_embeddings, self.config.d_model
        word = f"E_tok[id] · √{d}" if scaled else "E_tok[id]"
        times = (f"each token's vector is multiplied by √{d} = {d ** 0.5:.4g} (the square root of the model's width) "
                 "so that it starts about as large as the normalised vectors it is added to; ") if scaled else ""
        if self.position is not None:
            parts.append(EmbeddingPart("position", "E_pos[i]", self.position(torch.arange(n))))
            note = times + "a learned position vector is added to each token; each block normalises its own input (pre-LN)"
            return EmbeddingStep(tuple(parts), f"{word} + E_pos[i]", False, note)
        note = times + (
            "no position vector is added: RoPE turns every head's queries and keys by the token's position "
            "inside each attention layer"
        )
        return EmbeddingStep(tuple(parts), word, False, note)

    def attention_info(self, layer: int) -> AttentionInfo:
        """Layer ``layer``'s attention described for the trace (pre-LN, causal, RoPE or not, its window).

        Args:
            layer: the layer, 0-based.

        Returns:
            Its ``AttentionInfo``.
        """
        return attention_info(self.config.model_type, self.layers[layer].config)

    def trace_options(self) -> dict:
        """Keywords for a block's ``attention_steps`` on one unpadded text: causal.

        Returns:
            {"is_causal": True}; RoPE's positions default to 0 .. n-1.
        """
        return {"is_causal": True}

    def new_caches(self) -> list[KVCache]:
        """One empty ``KVCache`` per layer, for decoding piece by piece.

        Returns:
            n_layers empty caches, to pass to ``run``.
        """
        return [KVCache() for _ in self.layers]

    def forward(
        self, texts_or_ids, output_attentions: bool = False, output_hidden_states: bool = False, attention_mask=None
    ) -> ModelOutput:
        """Tokenise (unless given ids) and run the decoder.   -> ModelOutput, logits (batch, seq, vocab)

        Args:
            texts_or_ids: a string or a list of strings (padded on the left to the
                longest); or token ids: a list of ints, a list of lists of ints (padded),
                or an int tensor (seq,) or (batch, seq).
            output_attentions: also return every layer's weights, (batch, heads, seq, seq) each.
            output_hidden_states: also return n_layers + 1 tensors (batch, seq, d): the
                embeddings, each block's output, the last after the final norm (as
                transformers gives them).
            attention_mask: with an id tensor only: (batch, seq), 1 for real tokens.

        Returns:
            A ``ModelOutput`` with logits (batch, seq, vocab) and last_hidden_state
                (batch, seq, d) after the final norm.

        Raises:
            SentenceError: bad texts or ids, or more tokens than the model has positions.
            ModelError: texts given to a model built without a tokenizer.
        """
        encoded = self.tokenize(texts_or_ids, attention_mask)
        return self.run(encoded, output_attentions=output_attentions, output_hidden_states=output_hidden_states)

    def tokenize(self, texts_or_ids, attention_mask=None) -> Encoded:
        """Texts or ids -> a left-padded ``Encoded`` batch, checked against the model's positions.

        Args:
            texts_or_ids: as for ``forward``.
            attention_mask: with an id tensor only, (batch, seq) of 0 and 1.

        Returns:
            An ``Encoded``: tokens per row (no padding), input_ids and attention_mask
                (batch, seq).

        Raises:
            SentenceError: bad texts or ids, ids outside the vocabulary, or more tokens
                than the model has positions.
            ModelError: texts for a model without a tokenizer.
        """
        if isinstance(texts_or_ids, torch.Tensor):
            return self._from_tensor(texts_or_ids, attention_mask)
        if attention_mask is not None:
            raise SentenceError("attention_mask goes with a tensor of ids; texts and lists are padded here")
        if _is_id_list(texts_or_ids):
            rows = [list(texts_or_ids)] if _is_int(texts_or_ids[0]) else [list(r) for r in texts_or_ids]
            self._check_ids(rows)
            return self._padder().pad(rows)
        texts = as_text_list(texts_or_ids)
        if self.tokenizer is None:
            raise ModelError("this model was built without a tokenizer: give token ids")
        encoded = self.tokenizer.encode(texts)
        if min(encoded.lengths) == 0:
            raise SentenceError("a text gave no tokens at all: give it at least one character")
        return encoded

    def run(
        self,
        encoded: Encoded,
        caches: list[KVCache] | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        last_only: bool = False,
    ) -> ModelOutput:
        """The decoder on tokenised input, continuing ``caches`` when given.

        Args:
            encoded: input_ids (batch, seq) and an attention_mask that covers the cached
                tokens too: (batch, past + seq), 1 for real tokens.
            caches: None, or one ``KVCache`` per layer (``new_caches``), extended in place.
            output_attentions: also return each layer's weights (batch, heads, seq, past + seq).
            output_hidden_states: also return the hidden states (see ``forward``).
            last_only: logits for the last position only, (batch, 1, vocab), and (unless
                output_hidden_states) last_hidden_state too: all that generation needs; the
                output matrix is the largest product of a decoding step.

        Returns:
            A ``ModelOutput`` for the new tokens.

        Raises:
            SentenceError: the positions would pass the model's max_positions.
            ShapeError: the ids, the mask and the caches do not fit together.
        """
        ids, real = encoded.input_ids, encoded.attention_mask
        past = 0 if caches is None else caches[0].length
        if ids.dim() != 2 or real.dim() != 2 or real.shape != (ids.shape[0], past + ids.shape[1]):
            raise ShapeError(
                f"input_ids must be (batch, seq) and attention_mask (batch, past + seq): {tuple(ids.shape)} "
                f"and {tuple(real.shape)} with {past} cached"
            )
        seq = ids.shape[1]
        mask = _padding_mask(real, seq)  # None without padding: then only causal
        if mask is None:  # every row counts the same positions: no tensor work needed to find the last
            positions = torch.arange(past, past + seq, device=ids.device)  # (seq,)
            last_position = past + seq - 1
        else:
            positions = (real.cumsum(dim=-1) - 1).clamp(min=0)[:, past:]  # (batch, seq): counted over real tokens
            last_position = int(positions.max())
        if last_position >= self.config.max_positions:
            raise SentenceError(
                f"position {last_position} is past this model's {self.config.max_positions} positions: "
                f"at most {self.config.max_positions} tokens, the prompt and what is generated together"
            )
        x = self.embed(ids)  # (batch, seq, d)
        if self.config.scale_embeddings:
            # sqrt(d) as a float32 number first, then in x's dtype: as the checkpoints were trained.
            x = x * torch.tensor(self.config.d_model ** 0.5, dtype=torch.float32).to(x.dtype)
        if self.position is not None:
            x = x + self.position(positions)  # (batch, seq, d)
        c, rotations = self.config, {}
        if c.positional == "rope":  # cos and sin once per call and base, shared by the layers of that base
            rotations = {base: rope_rotation(positions, c.d_head, base, c.rope_scaling, x.dtype)
                         for base in set(c.layer_rope_bases)}
        # One new token is the newest position: the causal rule (bottom-right) hides no key
        # from it, so a decoding step skips building that mask in every layer.
        causal = seq > 1
        real_tokens = None if mask is None else real[:, past:].bool()  # (batch, seq): for intervention points
        hidden_states, attentions = [x], []
        for i, layer in enumerate(self.layers):
            cache = None if caches is None else caches[i]
            options = dict(attn_mask=mask, is_causal=causal, cache=cache, positions=rotations.get(c.layer_rope_bases[i]))
            if real_tokens is not None:
                options["real_tokens"] = real_tokens
            if output_attentions:
                x, weights = layer(x, **options, need_weights=True)
                attentions.append(weights)  # (batch, H, seq, past + seq)
            else:
                x = layer(x, **options)
            hidden_states.append(x)  # (batch, seq, d)
        if last_only and not output_hidden_states:
            x = x[:, -1:]  # (batch, 1, d): left padding puts every row's newest token last
        last = self.norm(x)  # (batch, seq, d)
        hidden_states[-1] = last  # as transformers: the last hidden state is after the final norm
        head_input = last[:, -1:] if last_only else last  # (batch, 1 or seq, d)
        logits = head_input @ self.output_matrix.T  # (batch, ., d) @ (d, vocab) -> (batch, ., vocab)
        return ModelOutput(
            tokens=encoded.tokens,
            input_ids=ids,
            attention_mask=real,
            last_hidden_state=last,
            hidden_states=tuple(hidden_states) if output_hidden_states else None,
            attentions=tuple(attentions) if output_attentions else None,
            model_name=self.name,
            logits=logits,
        )

    def generate(
        self, texts_or_ids, max_new_tokens: int = 20, temperature: float = 0.0, top_k=None, top_p=None, seed=None, **options
    ):
        """Continue each input: greedy at temperature 0, sampled otherwise, on our KVCache.

        A row stops after its first end-of-sequence token (config.eos_ids, from
        config.json and generation_config.json; BOS for a llama2.c model); the batch, padded on the left, stops
        when every row has or after max_new_tokens.

        Args:
            texts_or_ids: a string, a list of strings, or token ids (as ``forward``).
            max_new_tokens: the most tokens to add, 1 to 10000 (default 20). Past the
                model's positions the window slides: the oldest tokens drop off and the
                model sees the most recent ones (see ``selfattn.models.generation``).
            temperature: 0 (default): the most likely token each step; above 0: a draw
                from softmax(logits / temperature).
            top_k: draw only among the k most likely tokens (None: all).
            top_p: draw only from the smallest set of most likely tokens whose
                probabilities reach p, in (0, 1] (None: all).
            seed: the seed of the draws, for the same text every run (None: fresh).
            options: ``use_cache`` (default True; False recomputes every step) and
                ``on_token(row, token_id)``, called as each token is chosen.

        Returns:
            A ``Generation``: ``ids`` (each input's new token ids, a list of lists),
                ``text`` (each input's new text), the prompts' ids, the new tokens, per
                step the five most likely next tokens, ``window_slid_at`` (the first step
                chosen after the window slid, or None) and ``window_starts`` (where each
                step's window began). A llama2.c model's empty prompt "" is BOS alone.

        Raises:
            OptionError: an option is out of range (the message gives the range).
            SentenceError: a prompt is not valid input, or longer than the model's positions.
        """
        from selfattn.models.generation import generate

        return generate(self, texts_or_ids, max_new_tokens, temperature, top_k, top_p, seed, **options)

    def chat_ids(self, messages) -> list[int]:
        """The conversation as the ids the model reads: its chat template rendered (``models.chat``),
        the assistant's turn opened, tokenized without adding specials (the template writes its own).

        Args:
            messages: [{"role": "system" | "user" | "assistant", "content": text}, ...].

        Returns:
            The token ids of the laid-out conversation, ready for ``generate``.

        Raises:
            ModelError: the model has no chat template (``chat_template`` None) or no tokenizer.
            OptionError: the messages are malformed.
        """
        from selfattn.models.chat import render_chat

        if self.tokenizer is None:
            raise ModelError("this model has no tokenizer to read a conversation with")
        words = self.tokenizer.tokenizer
        name = lambda i: "" if i is None else (words.id_to_token(i) or "")  # noqa: E731
        text = render_chat(self.chat_template, messages, name(self.config.bos_id),
                           name(self.config.eos_ids[0] if self.config.eos_ids else None))
        return list(words.encode(text, add_special_tokens=False).ids)

    def chat(self, messages, max_new_tokens: int = 200, **options):
        """Answer a conversation: ``generate`` on its chat-template ids, stopping at the end of the turn.

        Args:
            messages: [{"role": "system" | "user" | "assistant", "content": text}, ...].
            max_new_tokens: the most tokens of the answer (default 200).
            options: as ``generate`` (temperature, top_k, top_p, seed, use_cache, on_token).

        Returns:
            The ``Generation``; ``.text[0]`` is the answer.
        """
        return self.generate([self.chat_ids(messages)], max_new_tokens, **options)

    def _padder(self) -> TextTokenizer:
        if self.tokenizer is not None:
            return self.tokenizer
        return _IdPadder(self.config.pad_id)

    def _check_ids(self, rows: list[list[int]]) -> None:
        for index, row in enumerate(rows):
            which = "the input" if len(rows) == 1 else f"input {index}"
            if not row:
                raise SentenceError(f"{which} has no token ids")
            if not all(_is_int(i) for i in row):
                raise SentenceError(f"{which}: token ids must be whole numbers")
            bad = [i for i in row if not 0 <= i < self.config.vocab_size]
            if bad:
                raise SentenceError(f"{which}: token id {bad[0]} is outside the vocabulary 0 .. {self.config.vocab_size - 1}")
            if len(row) > self.config.max_positions:
                raise SentenceError(
                    f"{which} has {len(row)} tokens; this model has {self.config.max_positions} positions"
                )

    def _from_tensor(self, ids: torch.Tensor, attention_mask) -> Encoded:
        if ids.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool) or ids.dim() not in (1, 2):
            raise SentenceError(f"token ids must be an int tensor (seq,) or (batch, seq), got {ids.dtype} {tuple(ids.shape)}")
        ids = (ids[None] if ids.dim() == 1 else ids).long()
        real = torch.ones_like(ids) if attention_mask is None else torch.as_tensor(attention_mask).long()
        if real.dim() == 1:
            real = real[None]
        if real.shape != ids.shape or not bool(((real == 0) | (real == 1)).all()):
            raise SentenceError(f"attention_mask must be 0/1 of the ids' shape {tuple(ids.shape)}, got {tuple(real.shape)}")
        rows = [row[keep.bool()].tolist() for row, keep in zip(ids, real)]
        self._check_ids(rows)
        padder = self._padder()
        return Encoded([[padder.token(i) for i in row] for row in rows], ids, real)


def _padding_mask(real: torch.Tensor, q_len: int) -> torch.Tensor | None:
    """Keys that are real tokens, and each query's own key.   (batch, kv_len) -> (batch, 1, q_len, kv_len) or None

    Without padding there is nothing to add to the causal mask. A padding query sees
    itself only, so its (meaningless) row stays finite instead of having no key at all.
    """
    if bool(real.all()):
        return None
    kv_len = real.shape[1]
    own = torch.arange(kv_len, device=real.device)[None, :] == torch.arange(kv_len - q_len, kv_len, device=real.device)[:, None]
    return real.bool()[:, None, None, :] | own  # (batch, 1, 1, kv_len) | (q_len, kv_len) -> (batch, 1, q_len, kv_len)


class _IdPadder:
    """Pads id lists on the left for a model without a tokenizer (tokens shown as their ids)."""

    padding_side = "left"

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def token(self, token_id: int) -> str:
        return f"<id {token_id}>"

    def decode(self, ids: list[int]) -> str:
        """No vocabulary, so no text: generated ids stay ids."""
        return ""

    def continuation(self, prompt_ids: list[int], new_ids: list[int]) -> str:
        """No vocabulary, so no text."""
        return ""

    pad = TextTokenizer.pad


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_id_list(value) -> bool:
    """A non-empty list of ints, or of lists (rows of ids)."""
    if not isinstance(value, (list, tuple)) or not value:
        return False
    return _is_int(value[0]) or isinstance(value[0], (list, tuple))
