"""Finding a query among a model's tokens: as the vocabulary writes it, as it reads, or by position.

BERT lower-cases its input and writes word pieces with '##'; a byte-level BPE writes a
word after a space as 'Ġcat', which reads ' cat'. A query matches any of these forms, and
a word the tokenizer cuts into several pieces is refused with the pieces named.
"""

from __future__ import annotations

from selfattn.errors import QueryError
from selfattn.pipeline.tokenize import find_query, quote_tokens

SPECIAL_TOKENS = ("[CLS]", "[SEP]", "[PAD]")  # BERT's, when a caller gives no tokenizer's own


def default_model_query(tokens: list[str], special: frozenset[str] = SPECIAL_TOKENS) -> int:
    """The seed's choice past the leading special tokens: the second token ('cat'), or the first for a one-word text."""
    start = 0
    while start < len(tokens) - 1 and tokens[start] in special:
        start += 1
    words = [i for i in range(start, len(tokens)) if tokens[i] not in special]
    return words[1] if len(words) > 1 else (words[0] if words else 0)


def find_model_query(
    tokens: list[str], query: str | int | None, readable: list[str] | None = None, special: frozenset[str] = SPECIAL_TOKENS
) -> int:
    """A query given as one of the model's tokens or a 0-based position.

    A token matches as the vocabulary writes it ('Ġcat', '##s'), as it reads ('cat' for
    ' cat'), or in any case when nothing matches exactly (BERT lower-cases its input).
    """
    if query is None:
        return default_model_query(tokens, special)
    if isinstance(query, str) and query not in tokens:
        forms = [(r or "").strip() for r in (readable or tokens)]
        for candidates, wanted in ((forms, query.strip()), ([t.lower() for t in tokens], query.lower()),
                                   ([f.lower() for f in forms], query.strip().lower())):
            if wanted in candidates:
                return candidates.index(wanted)
    try:
        return find_query(tokens, query)
    except QueryError as error:
        if isinstance(query, str) and "not in the sentence" in str(error):
            shown = [r.strip() or t for r, t in zip(readable or tokens, tokens)]
            first = next((t for t in tokens if t in special), None)
            hint = f" ({first} is 0)" if tokens and tokens[0] in special else ""
            raise QueryError(
                f"query token {query!r} is not among the model's tokens: choose one of "
                f"{quote_tokens(shown, 12, count=True)} (any case) or a 0-based position{hint}"
            ) from None
        raise


def model_query_piece(query: str, tokens: list[list[str]], readable: list[list[str]], model) -> str:
    """The query as one token of the model's vocabulary, when it is not already a token of both sentences.

    A query found in both (as written, as it reads, in any case) is kept. Otherwise the
    model's tokenizer cuts the query alone, and after a space (where a byte-level BPE
    puts a word inside a sentence: 'Ġcat'); a form that is one token is the answer
    ('Café' becomes BERT's 'cafe'). A word that every form cuts into several pieces is
    refused with the pieces named, since no single token of a sentence is that word.

    Args:
        query: the query as given, a word (not a position).
        tokens: each sentence's tokens, as the vocabulary writes them.
        readable: each sentence's tokens decoded alone.
        model: the loaded model (its ``tokenize`` and ``tokenizer``).

    Returns:
        The query, or the one token the tokenizer makes of it.

    Raises:
        QueryError: the tokenizer cuts the query into several pieces (named in the message).
    """
    finders = [model_finder(r, model) for r in readable]
    found = [finds(find, t, query) for find, t in zip(finders, tokens)]
    if all(found):
        return query
    special = model.tokenizer.special_tokens
    forms: list[list[tuple[str, str]]] = []
    for text in (query, " " + query.lstrip()):
        encoded = model.tokenize(text)
        pieces = [(t, r) for t, r in zip(encoded.tokens[0], model.tokenizer.readable(encoded.input_ids[0].tolist()))
                  if t not in special]
        if pieces and pieces not in forms:
            forms.append(pieces)
    singles = [form[0][0] for form in forms if len(form) == 1]
    for single in singles:
        if all(finds(find, t, single) for find, t in zip(finders, tokens)):
            return single
    if singles:
        return singles[0]  # _locate names the sentence without it
    if any(found) or not forms:
        return query  # in one sentence as given ('##ing'): _locate names the other
    pieces = [r.strip() or t for t, r in forms[-1]]  # as they read: a query matches that form
    example = next((p for t, p in zip(forms[-1], pieces) if t[1].strip()), pieces[0])
    raise QueryError(
        f"the model cuts the query {query!r} into {len(pieces)} tokens ({', '.join(repr(p) for p in pieces)}): "
        f"give one of them, e.g. {example!r}, or a 0-based position"
    )


def model_finder(readable: list[str], model):
    """find(tokens, query) -> index for one sentence, matching the model's tokens as written or as they read."""
    special = model.tokenizer.special_tokens
    return lambda tokens, query: find_model_query(tokens, query, readable, special)


def finds(find, tokens: list[str], query: str) -> bool:
    try:
        find(tokens, query)
    except QueryError:
        return False
    return True
