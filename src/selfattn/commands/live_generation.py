"""POST /api/generate: ``generate``'s tokens, and what each step saw, one step at a time.

The tokens are ``DecoderModel.generate``'s own (the same call, under ``ablate`` when heads
are knocked out), so the page and the library cannot disagree about them. The steps are
then read from plain forwards over the whole text: attention is causal, so row i of a
forward over the tokens is what the cached step computed when token i was the newest,
and its logits are those the next token was chosen from. One forward serves every step
that saw the same window (``Generation.window_starts``): one in all, until the window slides.

    step t:  seen = (prompt + new)[start_t : len(prompt) + t]     the key/value cache, len(seen) entries
             query = seen[-1]                                      the newest token reads the cache
             attention[layer][head] = its weights over seen        (heads, len(seen)) per layer
             top = the 10 likeliest of the distribution the token is drawn from

A request may ask for some layers and heads only (``layers``, ``heads``: "all" by default);
the answer then carries those rows alone, and its size is counted on what it carries. A
generation told to ``stop`` (its client has gone) stops at its next token.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import nullcontext
from typing import Any

from selfattn.commands.live import LiveModels, RequestError, labels_of
from selfattn.commands.live_generate_request import MAX_STEP_NUMBERS, TOP_SHOWN, GenerateRequest, generate_request

__all__ = ["GenerationStopped", "LiveGeneration", "generate_request"]


class GenerationStopped(RequestError):
    """The generation was told to stop (its client went away): nobody reads this answer."""

    def __init__(self) -> None:
        super().__init__("the client closed the connection: the generation stopped", 499)


class LiveGeneration:
    """One generation: checked and its prompt read when made, run by ``run`` or ``events``.

    A chat's prompt is its messages laid out by the model's own chat template, the
    assistant's turn opened; the answer stops at the template's end of turn.

    Raises (when made):
        RequestError: the model is an encoder, a chat goes to a model without a chat template,
            or a knocked-out head is out of range.
        SentenceError: the prompt is longer than the model's positions.
    """

    def __init__(self, models: LiveModels, request: GenerateRequest) -> None:
        from selfattn.analysis.head_interventions import check_heads

        if models.outline(request.model).kind != "decoder":
            raise RequestError(f"{request.model} is an encoder: it has no next-token head to generate with; "
                               "pick a decoder")
        self.models, self.request = models, request
        outline = models.outline(request.model)
        self.layers = tuple(range(outline.layers)) if request.layers is None else request.layers
        self.heads_shown = list(range(outline.heads)) if request.heads is None else list(request.heads)
        self._stopped = threading.Event()
        with models.using(request.model):
            self.model = model = models.model(request.model)
            self.heads = check_heads(model, [list(pair) for pair in request.ablate])
            if request.messages is None:
                encoded = model.tokenize(request.text)  # refuses a prompt longer than the positions
                self.prompt_ids = encoded.input_ids[0][encoded.attention_mask[0].bool()].tolist()
            else:
                self.prompt_ids = self._chat_ids(model)
        self._check_size(models.outline(request.model))
        self.result = None
        self.ids: list[int] = []
        self._window = None  # (start, the forward over the window from start)
        self._texts: dict[int, str] = {}  # new tokens -> their text, for each step's piece

    def _chat_ids(self, model) -> list[int]:
        """The conversation's ids by the model's chat template (refused when it has none or it fails)."""
        from selfattn.errors import ModelError

        if not getattr(model, "chat_template", None):
            raise RequestError(f"{self.request.model} has no chat template: it was not tuned for chat; "
                               "send text (a prompt) instead of messages")
        try:
            ids = model.chat_ids([{"role": role, "content": content} for role, content in self.request.messages])
        except ModelError as error:
            raise RequestError(str(error)) from None
        model.tokenize([ids])  # refuses a conversation longer than the positions
        return ids

    def _check_size(self, outline) -> None:
        """Refuse an answer of more than ``MAX_STEP_NUMBERS`` attention numbers, saying how many tokens fit."""
        request, prompt = self.request, len(self.prompt_ids)
        layers, heads = len(self.layers), len(self.heads_shown)  # the rows sent, not the model's

        def numbers(new: int) -> int:  # the most a run of ``new`` tokens could send
            keys = min(prompt + new, outline.positions)
            return max(0, new - request.first_step) * layers * heads * keys

        if numbers(request.max_new_tokens) <= MAX_STEP_NUMBERS:
            return
        fits = request.first_step
        while numbers(fits + 1) <= MAX_STEP_NUMBERS:
            fits += 1
        raise RequestError(
            f"max_new_tokens {request.max_new_tokens} would send up to {numbers(request.max_new_tokens)} attention "
            f"numbers ({layers} layers x {heads} heads per step); one answer holds at most "
            f"{MAX_STEP_NUMBERS}: ask for at most {fits} tokens, leave out the steps you have with first_step, "
            "or ask for fewer layers and heads"
        )

    def stop(self) -> None:
        """Stop the generation at its next token, and the steps at the next one (callable from any thread)."""
        self._stopped.set()

    def run(self, on_token=None) -> None:
        """Generate, as ``generate`` does (under ``ablate`` when heads are knocked out).

        on_token: called as on_token(row, token_id) as each token is chosen.

        Raises:
            GenerationStopped: ``stop`` was called; the generation ended at the token after it.
        """
        request = self.request

        def chosen(row: int, token: int) -> None:
            if self._stopped.is_set():  # raised inside generate: no forward for the next token
                raise GenerationStopped()
            if on_token is not None:
                on_token(row, token)

        with self.models.using(request.model), self._knockout():
            prompt = request.text if request.messages is None else [self.prompt_ids]
            self.result = self.model.generate(prompt, request.max_new_tokens, request.temperature,
                                              request.top_k, request.top_p, request.seed, on_token=chosen)
        assert self.result.prompt_ids[0] == self.prompt_ids
        self.ids = self.result.ids[0]

    def events(self) -> Iterator[dict[str, Any]]:
        """The answer as it is made: "start"; a "token" as each is chosen (generate runs in a
        thread); once it has finished, each "step" with its numbers; then "done"."""
        import queue

        yield {"event": "start", **self.start()}
        chosen: queue.Queue = queue.Queue()

        def chosen_token(row: int, token: int) -> None:
            self.ids.append(token)  # the tokens so far: each "token" line carries the text it adds
            chosen.put(("token", token))

        def work() -> None:
            try:
                self.run(on_token=chosen_token)
                chosen.put(("end", None))
            except Exception as error:  # noqa: BLE001 - handed to the stream, which says it
                chosen.put(("error", error))

        threading.Thread(target=work, name="selfattn-generate", daemon=True).start()
        padder, t = self.model._padder(), 0
        while True:
            kind, value = chosen.get()
            if kind == "error":
                raise value
            if kind == "end":
                break
            token = padder.token(value)
            yield {"event": "token", "step": t, "id": value, "token": token, "label": self._label(value),
                   "text": self._piece(t)}
            t += 1
        for step in self.steps():
            yield {"event": "step", **step}
        yield {"event": "done", **self.done()}

    def _knockout(self):
        from selfattn.analysis.head_interventions import knocked_out

        return knocked_out(self.model, self.heads, "zero") if self.heads else nullcontext()  # checked when made

    def start(self) -> dict[str, Any]:
        """What the page needs before the first step: the prompt's tokens and the request."""
        padder = self.model._padder()
        tokens = [padder.token(i) for i in self.prompt_ids]
        request = self.request
        return {
            "model": request.model,
            "prompt_ids": self.prompt_ids,
            "prompt_tokens": tokens,
            "prompt_labels": labels_of(self.model, self.prompt_ids, tokens),
            "positions": self.model.config.max_positions,
            "ablate": [list(pair) for pair in self.heads],
            "chat": request.messages is not None,
            "options": {"max_new_tokens": request.max_new_tokens, "temperature": request.temperature,
                        "top_k": request.top_k, "top_p": request.top_p, "seed": request.seed,
                        "first_step": request.first_step, "layers": list(self.layers), "heads": self.heads_shown},
        }

    def done(self) -> dict[str, Any]:
        """The contract's ``ids`` (the new tokens) and ``text`` (their text), and where the window slid."""
        return {"ids": self.ids, "text": self.result.text[0], "tokens": self.result.tokens[0],
                "steps_total": len(self.ids), "window_slid_at": self.result.window_slid_at}

    def steps(self) -> Iterator[dict[str, Any]]:
        """Each step from ``first_step`` on: the chosen token, the top 10, the query's attention, the cache."""
        for t in range(self.request.first_step, len(self.ids)):
            if self._stopped.is_set():
                raise GenerationStopped()
            yield self.step(t)

    def step(self, t: int) -> dict[str, Any]:
        from selfattn.models.generation import sampling_probs
        from selfattn.pipeline.steps import softmax
        request, padder = self.request, self.model._padder()
        start, end = self.result.window_starts[0][t], len(self.prompt_ids) + t
        out = self._forward(start)
        row = end - 1 - start  # the newest token of this step, in that forward
        logits = out.logits[0, row:row + 1]  # (1, vocab)
        probs = (softmax(logits.double(), dim=-1) if request.temperature == 0
                 else sampling_probs(logits, request.temperature, request.top_k, request.top_p))[0]  # (vocab,)
        values, order = probs.topk(min(TOP_SHOWN, probs.shape[0]))
        top = [{"id": int(i), "token": padder.token(int(i)), "label": self._label(int(i)), "p": float(p)}
               for i, p in zip(order.tolist(), values.tolist()) if p > 0]
        token_id = self.ids[t]
        token = padder.token(token_id)
        windows = [self.model.attention_info(layer).window for layer in self.layers]
        heads = slice(None) if request.heads is None else self.heads_shown  # a view, not a copy, for all
        n = end - start
        return {
            "step": t,
            "id": token_id,
            "token": token,
            "label": self._label(token_id),
            "text": self._piece(t),
            "p": float(probs[token_id]),
            "top": top,
            # [layers asked][heads asked][keys]
            "attention": [out.attentions[layer][0, heads, row, : row + 1].tolist() for layer in self.layers],
            "cache": {
                "length": n,
                "start": start,
                "reads": [[max(0, n - window) if window else 0, n] for window in windows],
            },
        }

    def _forward(self, start: int):
        """One forward over the text from ``start``, as far as the steps that saw that window reach."""
        import torch

        if self._window is None or self._window[0] != start:
            starts = self.result.window_starts[0]
            last = max(t for t, s in enumerate(starts) if s == start)
            everything = self.prompt_ids + self.ids
            end = min(len(self.prompt_ids) + last + 1, start + self.model.config.max_positions)
            # With the weights even when no row is asked for: the same forward, so the same logits to
            # the last digit whichever rows a request asks for.
            with self.models.using(self.request.model), self._knockout(), torch.no_grad():
                self._window = (start, self.model(everything[start:end], output_attentions=True))
        return self._window[1]

    def _label(self, token_id: int) -> str:
        """One token's label on the page ('␣Paris' where the vocabulary writes 'ĠParis')."""
        return labels_of(self.model, [token_id], [self.model._padder().token(token_id)])[0]

    def _piece(self, t: int) -> str:
        """The text step t adds (a token that is part of a character adds nothing until it completes)."""
        before, after = self._text(t), self._text(t + 1)
        return after[len(before):] if after.startswith(before) else after

    def _text(self, count: int) -> str:
        """The text of the first ``count`` new tokens, decoded once (each step reads its own and the one before)."""
        if count not in self._texts:
            self._texts[count] = self.model._padder().continuation(self.prompt_ids, self.ids[:count])
        return self._texts[count]

    def whole(self) -> dict[str, Any]:
        """The answer in one JSON object: ``ids``, ``text`` and every step (from ``first_step``)."""
        self.run()
        return {**self.start(), **self.done(), "steps": list(self.steps())}
