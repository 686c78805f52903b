"""The model walkthrough's first steps: what the model is, its tokens, its embeddings.

Also the small helpers every step of ``model_walkthrough`` shares (how a token is shown,
the query's label, wide vectors cut to their first components). Read from the record
(``AttentionTrace``) and its "model" section's own records (``embedding``, each layer's
``AttentionInfo``), the same for every family.
"""

from __future__ import annotations


import torch

from selfattn.render.text.document import (
    Block,
    Document,
    Heading,
    Lines,
    Note,
    Paragraph,
    Table,
    component_headers,
    display_token,
    fmt,
    token_table,
    vector_cells,
)
from selfattn.trace.record import AttentionTrace

TOP_SHOWN = 3  # tokens named in "puts the most weight on"
SPECIAL_SHARE_NOTED = 0.25  # above this share of weight on an encoder's special tokens, say why
SPLIT_WORDS_SHOWN = 3  # words cut into pieces named in the tokens step
SPACE = "␣"  # how a token's space is shown
NORMS = {"rms": "RMSNorm", "layer": "LayerNorm"}
NORM_TEXT = {
    "rms": "RMSNorm divides each vector by the root of the mean of its squared components and multiplies each "
    "component by a learned gain; unlike LayerNorm it subtracts no mean and adds no shift.",
    "layer": "LayerNorm subtracts the mean of the vector's components, divides by their standard deviation, and "
    "applies a learned scale and shift to each component.",
}
FEED_FORWARD = {
    "gelu": "widen, GELU, narrow back",
    "gelu_tanh": "widen, GELU in its tanh form, narrow back",
    "swiglu": "SwiGLU: two widening projections, one passed through SiLU, multiplied component by component, "
    "then narrowed back",
    "geglu_tanh": "GeGLU: two widening projections, one passed through GELU in its tanh form, multiplied "
    "component by component, then narrowed back",
}
PARTS = {
    "word": "the row of the word table for its id (what the token is)",
    "position": "the row of the position table for its place (where it is)",
    "type": "a token-type vector (which of two texts it belongs to; with one text every token gets type 0)",
}
COUNTS = {1: "one", 2: "two", 3: "three"}


def token_label(t: AttentionTrace, j: int) -> str:
    """Token j as it reads, a space shown as ␣ (the vocabulary's spelling where decoding alone says nothing)."""
    readable = t.sections["model"].readable
    text = readable[j] if j < len(readable) else ""
    if not text or "\ufffd" in text:  # nothing, or part of one character's bytes
        text = t.tokens[j]
    return display_token(text.replace(" ", SPACE))


def token_cell(t: AttentionTrace, j: int) -> str:
    label, raw = token_label(t, j), display_token(t.tokens[j])
    # A vocabulary that spells a space as a space (llama2.c's) spells the token as it reads.
    return label if label in (raw, display_token(t.tokens[j].replace(" ", SPACE))) else f"{label} ({raw})"


def query_label(t: AttentionTrace) -> str:
    return f"'{token_label(t, t.query.index)}'"


def is_special(t: AttentionTrace, j: int) -> bool:
    """Whether token j is one of the vocabulary's special tokens."""
    return t.tokens[j] in t.sections["model"].special_tokens


def vector_length(vector: torch.Tensor) -> float:
    """|x|, the length of a vector: a one-number summary of a wide vector, for display."""
    return float(vector.double().norm())


def hidden_name(layer: int) -> str:
    return "X₀" if layer == 0 else f"X_{layer}"


def count_word(n: int) -> str:
    return COUNTS.get(n, str(n))


def listed(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def seen_keys(t: AttentionTrace, i: int) -> list[int]:
    """The keys query i may see (the chosen layer's allowed row; every key without a mask)."""
    n, allowed = len(t.tokens), t.steps.allowed
    return list(range(n)) if allowed is None else [j for j in range(n) if bool(allowed[i, j])]


def key_span(keys: list[int]) -> str:
    if len(keys) == 1:
        return f"position {keys[0]}"
    if keys == list(range(keys[0], keys[-1] + 1)):
        return f"positions {keys[0]} to {keys[-1]}"
    return "positions " + ", ".join(map(str, keys))


def wide_row(t: AttentionTrace, vectors: torch.Tensor, p: int, j: int) -> list[str]:
    """Token j's row: its label, the first and last components, then the length."""
    return [token_label(t, j)] + vector_cells(vectors[j].tolist(), p) + [fmt(vector_length(vectors[j]), 2)]


def wide_table(t: AttentionTrace, vectors: torch.Tensor, p: int, title: str) -> list[Block]:
    """One row per token (cut past ``SHOWN_ROWS``, with a line saying so), the query's highlighted."""
    return token_table(["token"] + component_headers(vectors.shape[-1], "x") + ["|x|"], len(t.tokens), t.query.index,
                       lambda j: wide_row(t, vectors, p, j), title=title)


def rope_base_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def intro_step(doc: Document, t: AttentionTrace) -> None:
    m, h = t.sections["model"], t.head
    a = m.infos[t.layer]
    d_model, d_head = int(t.embeddings.shape[-1]), int(t.steps.q.shape[-1])
    kind = (
        "a decoder: each token sees only itself and the tokens before it (causal attention), as a model that "
        "predicts the next token must" if a.causal
        else "an encoder: every token sees every token, before and after it (bidirectional attention)"
    )
    width = (
        f"each head works on {d_head} of them ({t.n_heads} × {d_head} = {d_model})"
        if t.n_heads * d_head == d_model else f"each head projects it to {d_head} numbers"
    )
    facts = []
    if a.n_kv_heads < a.n_heads:
        share = "multi-query attention" if a.n_kv_heads == 1 else f"grouped-query attention, {a.group_size} query heads to each"
        facts.append(f"Its {a.n_heads} query heads share {count_word(a.n_kv_heads)} key/value head{'s' if a.n_kv_heads > 1 else ''} "
                     f"({share}): head {h} reads key/value head {t.steps.kv_head_of[h]}.")
    if a.positional == "rope":
        facts.append(f"Positions enter through RoPE (rotary position embedding): inside every attention layer, each "
                     f"head's queries and keys are turned by angles that grow with the position, with base θ = {rope_base_text(a.rope_base)}."
                     + (f" Its frequencies are rescaled ({a.rope_scaling})." if a.rope_scaling else ""))
    else:
        facts.append("Positions come from a learned table of position vectors, added to the embeddings (step 2).")
    where = "before its attention and before its feed-forward network (pre-norm)" if a.norm_first else "after its attention and after its feed-forward network (post-norm)"
    facts.append(f"Each layer normalises with {NORMS.get(a.norm, a.norm)} {where}.")
    if a.window is not None:
        facts.append(f"Layer {t.layer} attends through a sliding window of {a.window}: a query sees at most its "
                     f"{a.window} newest keys, itself included.")
    trained = (
        "Every weight here was learned from data (this model was trained to place sentences with similar "
        "meaning close together), unlike the seed's hand-made table or the variants' random weights. So the "
        "patterns below are what a real model does, not arithmetic on made-up numbers."
        if m.default_model else
        "Every weight here was learned by Andrej Karpathy's training for llama2.c on TinyStories, short "
        "stories in simple English, about 260 thousand parameters in all; selfattn reads his checkpoint as "
        "published. So the patterns below are what a real (small) language model learned, not arithmetic on "
        "random numbers."
        if m.builtin and m.model_name == "stories260K" else
        "Every weight here was learned by Hugging Face's SmolLM2 team: a 135-million-parameter language "
        "model trained on about two trillion tokens of web text, code and maths, then tuned to follow "
        "instructions and chat. So the patterns below are what a real language model does."
        if m.builtin and m.model_name == "SmolLM2-135M-Instruct" else
        "Every weight here was learned by selfattn's own training (selfattn train): tiny-induction on random "
        "symbols repeated, so it learned to continue a repeat; tiny-shakespeare on Shakespeare's plays, one "
        "character at a time. So the patterns below are learned behaviour, not arithmetic on random numbers."
        if m.builtin else
        "The weights are this checkpoint's own, read from its files. If it was trained, the patterns below are "
        "what it learned; a randomly initialised checkpoint (a tiny test model, say) gives near-arbitrary "
        "patterns, so read its numbers as arithmetic, not as behaviour."
    )
    if m.weight_blocks:
        trained += " " + quantized_note(m.weight_blocks)
    doc.add(
        Paragraph(
            f"Model {m.model_name} ({a.family} architecture) is {kind}. It has {t.n_layers} layers of {t.n_heads} "
            f"attention heads. Every token is a vector of {d_model} numbers, and {width}."
        ),
        Paragraph(" ".join(facts)),
        Note(trained),
        Paragraph(
            f"This walkthrough follows layer {t.layer}, head {h}, with {query_label(t)} (position {t.query.index}) "
            f"as the query. Layers, heads and positions count from 0, as everywhere in selfattn: the model's "
            f"{t.n_layers} layers are layers 0 to {t.n_layers - 1} and its {t.n_heads} heads are heads 0 to {t.n_heads - 1}."
        ),
    )


def quantized_note(blocks: dict) -> str:
    """What a GGUF file's block types mean for the numbers below: its weights were rounded to few bits."""
    def listed(names):
        return ", ".join(f"{n} ({blocks[n]} tensor{'s' if blocks[n] > 1 else ''})" for n in names)

    exact = [name for name in blocks if name in ("F32", "F16", "BF16")]
    lossy = [name for name in blocks if name not in exact]
    if not lossy:
        return f"Its GGUF file stores the weights unquantized: {listed(exact)}."
    rest = f"; {listed(exact)} as they were" if exact else ""
    return (f"Its GGUF file stores the weights quantized: {listed(lossy)}{rest}. A quantized block keeps a scale "
            f"and a few bits per weight; selfattn expanded them to floats, so every number here is the rounded "
            f"weight the file holds, as llama.cpp computes with it, not the model's original.")


def _tokenizer(t: AttentionTrace) -> str:
    """The tokenizer's kind, by what its tokens look like."""
    special = t.sections["model"].special_tokens
    if any(tok.startswith("##") for tok in t.tokens) or any(s[:1] == "[" and s[-1:] == "]" for s in special):
        return "wordpiece"
    if any("Ġ" in tok or "Ċ" in tok for tok in t.tokens):
        return "byte-level"
    if any(tok.startswith("▁") for tok in t.tokens):
        return "sentencepiece"
    return "other"


def _continues(t: AttentionTrace, j: int, kind: str) -> bool:
    """Whether token j continues the word of token j - 1."""
    if j == 0 or is_special(t, j) or is_special(t, j - 1):
        return False
    if kind == "wordpiece":
        return t.tokens[j].startswith("##")
    readable = t.sections["model"].readable
    before, text = readable[j - 1], readable[j]
    return text[:1].isalnum() and (before[-1:].isalnum() or set(before) == {" "})  # a bare space starts the word after it


def _split_words(t: AttentionTrace, kind: str) -> list[tuple[str, list[str]]]:
    """Words the tokenizer cut into pieces: (the word, its pieces as shown), in order."""
    readable = t.sections["model"].readable
    words: list[list[int]] = []
    for j in range(len(t.tokens)):
        if words and _continues(t, j, kind):
            words[-1].append(j)
        else:
            words.append([j])
    if kind == "wordpiece":
        return [("".join(t.tokens[j].removeprefix("##") for j in w), [display_token(t.tokens[j]) for j in w]) for w in words if len(w) > 1]
    return [("".join(readable[j] for j in w).strip(), [token_label(t, j) for j in w]) for w in words if len(w) > 1]


def tokens_step(doc: Document, t: AttentionTrace) -> None:
    m = t.sections["model"]
    n, q, kind = len(t.tokens), t.query.index, _tokenizer(t)
    lowered = any(c.isupper() for c in m.sentence) and not any(c.isupper() for j, tok in enumerate(t.tokens) if not is_special(t, j) for c in tok)
    space = {"byte-level": "Ġ", "sentencepiece": "▁"}.get(kind)
    if kind == "wordpiece":
        text = (
            f"The model cuts the text with its own WordPiece tokenizer: {n} tokens here. It "
            + ("lower-cases the text, " if lowered else "")
            + "splits off punctuation, and cuts a word that is not in its vocabulary into pieces that are; a piece "
            "starting with '##' continues the word before it."
        )
    elif space:
        name, unit = ("byte-level BPE", "the text's UTF-8 bytes") if kind == "byte-level" else ("SentencePiece", "characters")
        text = (
            f"The model cuts the text with its own {name} tokenizer into {n} tokens. It merges runs of {unit} that "
            "were frequent in its training text into single tokens, so nothing is lower-cased and a word it rarely "
            f"saw stays in several pieces. A space belongs to the token after it, and the vocabulary writes it as '{space}'"
        )
        marked = next((j for j in range(n) if t.tokens[j].startswith(space) and len(t.tokens[j]) > 1 and not is_special(t, j)), None)
        text += "." if marked is None else f": {m.readable[marked]!r} is the token {t.tokens[marked]!r}."
    else:
        text = f"The model cuts the text with its own tokenizer into {n} tokens, each an entry of its vocabulary."
    special = [j for j in range(n) if is_special(t, j)]
    if special:
        places = [f"{display_token(t.tokens[j])} " + ("at the front" if j == 0 else "at the end" if j == n - 1 else f"at position {j}") for j in special]
        text += f" It also adds {count_word(len(special))} token{'s' if len(special) > 1 else ''} of its own: {listed(places)}."
    else:
        text += " It adds no special tokens of its own to this text."
    text += " Each token has an id, its row in the embedding table."
    differs = sorted((j for j in range(n) if token_cell(t, j) != token_label(t, j)), key=lambda j: not any(c.isalnum() for c in m.readable[j]))
    if differs:
        text += (f" A token is shown as it reads, with {SPACE} for a space; where the vocabulary spells it otherwise, "
                 f"its spelling follows in brackets, as in {token_cell(t, differs[0])}.")
    broken = [j for j in range(n) if "\ufffd" in m.readable[j]]
    if broken:
        text += (" A token that holds only part of a character's UTF-8 bytes reads as nothing alone, so it is shown "
                 f"as the vocabulary writes it ({display_token(t.tokens[broken[0]])} here).")
    split = _split_words(t, kind)
    if split:
        shown = "; ".join(f"'{display_token(word)}' became {' + '.join(pieces)}" for word, pieces in split[:SPLIT_WORDS_SHOWN])
        text += f" Here {shown}."
    rows = [[str(i), token_cell(t, i), str(m.input_ids[i]), "← query" if i == q else "special" if is_special(t, i) else ""] for i in range(n)]
    title = "WordPiece tokens" if kind == "wordpiece" else "Tokens"
    doc.add(Heading(f"Step 1 · {title}"), Paragraph(text), Table(["position", "token", "id", ""], rows, highlight_row=q, numeric_from=2))


def embeddings_step(doc: Document, t: AttentionTrace, p: int) -> None:
    m = t.sections["model"]
    q, d, e = t.query.index, int(t.embeddings.shape[-1]), m.embedding
    order = {"word": 0, "position": 1, "type": 2}
    shown = sorted(e.parts, key=lambda part: order.get(part.name, 3))
    said = [PARTS.get(part.name, part.label) for part in shown]
    if len(shown) == 1:
        text = f"Each token starts as one learned vector of {d} numbers: {said[0]}."
    else:
        text = f"Each token starts as the sum of {count_word(len(shown))} learned vectors of {d} numbers: {', '.join(said[:-1])}, and {said[-1]}."
    if e.normalised:
        text += (" LayerNorm then rescales the sum: it subtracts the mean of its numbers, divides by their standard "
                 "deviation, and applies a learned scale and shift to each component.")
    names = {"word": f"word (id {m.input_ids[q]})", "position": f"position {q}", "type": "type 0"}
    parts = [(names.get(part.name, part.label), part.vectors[q]) for part in shown]
    if len(shown) > 1:  # for display; with a LayerNorm after it, the model's own sum is not in the trace
        parts.append(("sum", sum(part.vectors[q] for part in shown) if e.normalised else t.embeddings[q]))
    if e.normalised:
        parts.append(("LayerNorm", t.embeddings[q]))
    heading = " + ".join(part.name for part in shown) if len(shown) > 1 else f"{shown[0].name} vectors only"
    doc.add(
        Heading(f"Step 2 · Embeddings: {heading}{', then LayerNorm' if e.normalised else ''} ({len(t.tokens)} × {d})"),
        Paragraph(text + f" {e.note[:1].upper()}{e.note[1:]}."),
        Lines([f"X₀ = {e.formula}"]),
        Paragraph(
            f"{d} numbers do not fit on a line, so a vector is shown by its first components, '…', and its last "
            "one, and |x| is the length of the whole vector. --format json has every number."
        ),
    )
    if len(parts) > 1:
        doc.add(Table([query_label(t)] + component_headers(d, "x") + ["|x|"], [[name] + vector_cells(v.tolist(), p) + [fmt(vector_length(v), 2)] for name, v in parts],
                      title=f"The parts of {query_label(t)}"))
    doc.add(
        *wide_table(t, t.embeddings, p, "X₀: every token after LayerNorm" if e.normalised else "X₀: every token's first vector"),
        Paragraph(
            "These vectors are what layer 0 reads"
            + (", the layer this walkthrough follows." if t.layer == 0 else f"; {layers_before(t.layer)} {'changes' if t.layer == 1 else 'change'} them before layer {t.layer} sees them.")
        ),
    )


def layers_before(layer: int) -> str:
    return {1: "layer 0", 2: "layers 0 and 1"}.get(layer, f"layers 0 to {layer - 1}")
