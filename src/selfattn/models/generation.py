"""Text generation with a decoder: one new token per step, the earlier keys and values cached.

    step 0:  logits = model(prompt)[:, -1]            the prompt fills every layer's KVCache
    step t:  next = choose(logits);  logits = model(next, caches)[:, -1]    one token in, one out

choose: the most likely token at temperature 0 (greedy); otherwise a draw from
softmax(logits / T), first cut to the k most likely tokens (top_k) and then to the
smallest set whose probabilities reach p (top_p, "nucleus"). A row stops at its first
end-of-sequence token (which is kept in its ids); the batch stops when every row has, or
after max_new_tokens. Prompts are padded on the left, so every row's newest token is in
the last column and one column is appended per step.

Past the context window. The model has ``max_positions`` positions; generation may go on
longer. When the next step would need more columns than that, the window slides: the
oldest columns of the whole batch drop off (a shorter prompt's padding first), the most
recent ``kept_after_slide(max_positions)`` stay, and every layer's cache is rebuilt by one
fresh forward over them, their positions counted from 0 again (what the model was trained
on: a learned-position table has no row past its last, and a RoPE model never saw a window
that did not start at 0). Decoding then carries on against that cache until the window is
full again. The path without a cache slides at the same steps, so it stays the check of
the cache.

How far a slide goes. Dropping one token per step gives the model the most context, but
then the cache no longer helps: every step is a forward over the whole window. Dropping a
quarter of the window at once (``SLIDE_SHARE``) costs that forward once every
max_positions / 4 steps, and the model still sees between 3/4 of its positions and all of
them. Measured on 2 CPU threads, greedy:

    tokens per second                              slide by 1   slide by 1/4   inside the window
    tiny-shakespeare (64 positions), 1000 new         330           680             740
    GPT-2 shape, d 512, 8 layers, 512 positions        5.7          116             174
    (the last model random, from a full 512-token prompt; "inside the window": 8 + 200 tokens)

and what the lost context costs: tiny-shakespeare's loss on 19,937 characters of
Shakespeare, each seen through the window the rule gives it, is 1.82 nats a character
sliding by one (always 64 characters before it) and 1.74 by a quarter (48 to 64): this
model uses little context past a few words (its loss by position is flat from about the
8th). So a slide drops a quarter.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from selfattn.errors import OptionError
from selfattn.models.generation_options import check_generation_options
from selfattn.models.tokenizer import Encoded
from selfattn.pipeline.steps import softmax

TOP = 5  # how many of the most likely next tokens each step records
SLIDE_SHARE = 4  # a slide drops 1/SLIDE_SHARE of the window (at least one token); see the module docstring


@dataclass(frozen=True)
class TokenChance:
    """One candidate next token.

    Attributes:
        id: its token id.
        token: the vocabulary's string for it.
        probability: softmax(logits) at that id, in [0, 1].
    """

    id: int
    token: str
    probability: float


@dataclass
class Generation:
    """What ``generate`` made, per input in the order given.

    Attributes:
        ids: the new token ids of each input (prompt excluded, the end-of-sequence token
            kept when it came), a list of lists.
        text: each input's new text, decoded without special tokens.
        prompt_ids: each prompt's ids (no padding).
        tokens: the new tokens of each input as the vocabulary writes them.
        top: per input, per generated step, the ``TOP`` most likely next tokens under
            the model's softmax(logits) (before temperature, top_k and top_p).
        window_slid_at: the first step (0-based, an index into each row's ``ids`` and
            ``top``) whose token was chosen after the window slid, dropping the oldest
            columns; None when everything fitted in the model's positions. The batch
            slides together: a shorter prompt loses its padding first (its own tokens
            dropped show in ``window_starts``).
        window_starts: per input, per generated step, where the tokens the model saw
            began in that input's prompt + new ids: with ``start = window_starts[i][t]``,
            step t's logits are those of a fresh forward over
            ``(prompt_ids[i] + ids[i])[start : len(prompt_ids[i]) + t]`` (positions from 0);
            0 until the window slides.
    """

    ids: list[list[int]]
    text: list[str]
    prompt_ids: list[list[int]]
    tokens: list[list[str]]
    top: list[list[list[TokenChance]]]
    window_slid_at: int | None = None
    window_starts: list[list[int]] = field(default_factory=list)


def generate(
    model,
    texts_or_ids,
    max_new_tokens: int = 20,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    use_cache: bool = True,
    on_token: Callable[[int, int], None] | None = None,
) -> Generation:
    """Continue each input with up to max_new_tokens tokens.   -> Generation (ids, text)

    Args:
        model: a ``DecoderModel``.
        texts_or_ids: a string, a list of strings, or token ids (as the model's forward).
        max_new_tokens: how many tokens to add at most, from 1 to ``MAX_NEW_TOKENS``.
            Past the model's positions the window slides: the model sees the most
            recent tokens only (see the module docstring).
        temperature: 0 (default) picks the most likely token; above 0 samples from
            softmax(logits / temperature).
        top_k: sample only among the k most likely tokens (None: all).
        top_p: sample only from the smallest set of tokens whose probabilities add up
            to at least p, in (0, 1] (None: all).
        seed: the sampling generator's seed, for the same draws every run (None: fresh).
        use_cache: keep each layer's keys and values (default); False recomputes the
            whole window every step (the same result, slower: a check of the cache).
        on_token: called as on_token(row, token_id) for each token as it is chosen, e.g.
            to stream text.

    Returns:
        A ``Generation``; its ``window_slid_at`` and ``window_starts`` say what each
            step saw.

    Raises:
        OptionError: an argument is out of range (the message gives the range).
        SentenceError: a prompt is not valid input or longer than the model's positions.
    """
    check_generation_options(max_new_tokens, temperature, top_k, top_p, seed)
    encoded = model.tokenize(texts_or_ids)  # refuses a prompt longer than the positions
    limit = model.config.max_positions
    kept = kept_after_slide(limit)
    sampler = None if temperature == 0 else torch.Generator().manual_seed(seed if seed is not None else _fresh_seed())
    batch, prompt_len = encoded.input_ids.shape
    prompt_ids = [row[keep.bool()].tolist() for row, keep in zip(encoded.input_ids, encoded.attention_mask)]
    padding = [prompt_len - len(row) for row in prompt_ids]  # each row's padding columns on the left
    new_ids: list[list[int]] = [[] for _ in range(batch)]
    top: list[list[list[TokenChance]]] = [[] for _ in range(batch)]
    starts: list[list[int]] = [[] for _ in range(batch)]
    done = [False] * batch
    eos = set(model.config.eos_ids)
    caches = model.new_caches() if use_cache else None
    padder = model._padder()  # the tokenizer, or ids shown as ids when the model has none
    # The window: the columns the model sees now, at most `limit`; `dropped` columns are gone.
    ids, mask, dropped, slid_at = encoded.input_ids, encoded.attention_mask, 0, None
    with torch.no_grad():
        logits = model.run(encoded, caches, last_only=True).logits[:, -1]  # (batch, vocab)
        for t in range(max_new_tokens):
            chosen = choose(logits, temperature, top_k, top_p, sampler)  # (batch,)
            top_ids, top_probs = top_chances(logits)  # (batch, TOP) each
            chosen_list, top_ids, top_probs = chosen.tolist(), top_ids.tolist(), top_probs.tolist()
            for row in range(batch):
                if done[row]:
                    continue
                token = chosen_list[row]
                new_ids[row].append(token)
                top[row].append([TokenChance(i, padder.token(i), p) for i, p in zip(top_ids[row], top_probs[row])])
                starts[row].append(max(0, dropped - padding[row]))  # padding columns go before real tokens
                done[row] = token in eos
                if on_token is not None:
                    on_token(row, token)
            if all(done) or t == max_new_tokens - 1:  # no step needs the next logits
                break
            step = torch.tensor([[row[-1]] for row in new_ids])  # (batch, 1): a finished row repeats its last token
            ids = torch.cat([ids, step], dim=1)  # (batch, window + 1)
            mask = torch.cat([mask, torch.ones_like(step)], dim=1)  # (batch, window + 1)
            if ids.shape[1] > limit:  # slide: keep the newest columns, rebuild the caches over them
                cut = ids.shape[1] - kept
                ids, mask, dropped = ids[:, cut:], mask[:, cut:], dropped + cut  # (batch, kept) each
                slid_at = t + 1 if slid_at is None else slid_at
                caches = model.new_caches() if use_cache else None
                logits = model.run(Encoded(encoded.tokens, ids, mask), caches, last_only=True).logits[:, -1]
            elif use_cache:
                logits = model.run(Encoded(encoded.tokens, step, mask), caches, last_only=True).logits[:, -1]
            else:
                logits = model.run(Encoded(encoded.tokens, ids, mask), last_only=True).logits[:, -1]
    texts = [padder.continuation(prompt, row) for prompt, row in zip(prompt_ids, new_ids)]
    tokens = [[padder.token(i) for i in row] for row in new_ids]
    return Generation(new_ids, texts, prompt_ids, tokens, top, slid_at, starts)


def kept_after_slide(limit: int) -> int:
    """How many of the newest tokens a slide keeps, for a model of ``limit`` positions.

    limit - floor(limit / SLIDE_SHARE), and never fewer than 1 or more than limit: a slide
    drops at least one token, and at 1 to 3 positions the window moves one token a step.

    Args:
        limit: the model's max_positions, >= 1.

    Returns:
        The window's length right after a slide.

    Examples:
        >>> from selfattn.models.generation import kept_after_slide
        >>> kept_after_slide(64), kept_after_slide(512), kept_after_slide(2)
        (48, 384, 2)
    """
    return max(1, limit - limit // SLIDE_SHARE)


def choose(logits: torch.Tensor, temperature: float, top_k=None, top_p=None, generator=None) -> torch.Tensor:
    """The next token of each row.   (batch, vocab) -> (batch,) int64

    argmax at temperature 0; else a draw from softmax(logits / T) restricted to the
    top_k most likely tokens, then to the smallest set reaching probability top_p.

    Args:
        logits: next-token scores, (batch, vocab).
        temperature: 0 for greedy, else > 0.
        top_k: keep only the k largest logits of each row (None: all).
        top_p: keep the smallest set of most likely tokens whose probabilities sum to at
            least p (the most likely token always stays); None: all.
        generator: the ``torch.Generator`` to draw with.

    Returns:
        One token id per row.

    Examples:
        >>> import torch
        >>> from selfattn.models.generation import choose
        >>> logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 0.0]])
        >>> choose(logits, 0.0).tolist()
        [1, 0]
        >>> choose(logits, 1.0, top_k=1, generator=torch.Generator().manual_seed(0)).tolist()
        [1, 0]
    """
    if temperature == 0:
        return logits.argmax(dim=-1)
    return torch.multinomial(sampling_probs(logits, temperature, top_k, top_p), 1, generator=generator)[:, 0]


def sampling_probs(logits: torch.Tensor, temperature: float, top_k=None, top_p=None) -> torch.Tensor:
    """The distribution ``choose`` draws from.   (batch, vocab) -> (batch, vocab) float64

    p = softmax(logits / T) over the top_k most likely tokens, then over the smallest set
    of them whose probabilities reach top_p; every other token gets exactly 0.

    Args:
        logits: next-token scores, (batch, vocab).
        temperature: > 0.
        top_k: keep only the k largest logits of each row (None: all).
        top_p: keep the smallest set of most likely tokens whose probabilities sum to at
            least p (the most likely token always stays); None: all.

    Returns:
        Each row's probabilities, summing to 1.

    Examples:
        >>> import torch
        >>> from selfattn.models.generation import sampling_probs
        >>> sampling_probs(torch.tensor([[0.0, 3.0, 1.0]]), 1.0, top_k=2).round(decimals=4).tolist()
        [[0.0, 0.8808, 0.1192]]
    """
    if not temperature > 0:
        raise OptionError(f"temperature must be above 0 to sample, got {temperature!r}")
    scaled = logits.double() / temperature  # (batch, vocab)
    if top_k is not None and top_k < scaled.shape[-1]:
        kth = scaled.topk(top_k, dim=-1).values[:, -1:]  # (batch, 1): the k-th largest
        scaled = scaled.masked_fill(scaled < kth, -math.inf)
    if top_p is not None and top_p < 1:
        ordered, order = scaled.sort(dim=-1, descending=True)  # (batch, vocab)
        probs = softmax(ordered, dim=-1)
        before = probs.cumsum(dim=-1) - probs  # probability of the more likely tokens
        ordered = ordered.masked_fill(before >= top_p, -math.inf)  # the first token always stays (before = 0)
        scaled = torch.full_like(scaled, -math.inf).scatter(-1, order, ordered)
    return softmax(scaled, dim=-1)


def top_chances(logits: torch.Tensor, k: int = TOP) -> tuple[torch.Tensor, torch.Tensor]:
    """The k most likely next tokens and their probabilities.   (batch, vocab) -> (batch, k) ids, (batch, k) float64

    p_i = exp(logit_i - log sum_j exp(logit_j)) for the k largest logits only: the same
    numbers as softmax(logits) at those ids, without normalising the whole vocabulary
    (the log-sum-exp in float64, as the probabilities are reported).

    Args:
        logits: next-token scores, (batch, vocab).
        k: how many tokens per row (default ``TOP``; fewer if the vocabulary is smaller).

    Returns:
        The pair (ids, probabilities), (batch, k) each, most likely first; the
            probabilities are float64.
    """
    values, ids = logits.topk(min(k, logits.shape[-1]), dim=-1)  # (batch, k)
    log_total = torch.logsumexp(logits.double(), dim=-1, keepdim=True)  # (batch, 1)
    return ids, (values.double() - log_total).exp()


def _fresh_seed() -> int:
    return int(torch.randint(0, 2**62, (1,)).item())

