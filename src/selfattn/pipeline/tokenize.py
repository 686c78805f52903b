"""Step 1 of the seed: split raw text into tokens.

The seed uses word-level tokens: the sentence split on whitespace. Punctuation stays
attached to its word ("mat." is one token) and case is kept ("The" and "the" are two
different tokens with two different embeddings).
"""

from __future__ import annotations

from selfattn.errors import QueryError, SentenceError


def tokenize(sentence: str) -> list[str]:
    """Split a sentence on whitespace: "The cat sat" -> ["The", "cat", "sat"].

    Word-level tokens, as in the seed: any run of whitespace separates two tokens,
    punctuation stays attached to its word ("mat." is one token) and case is kept
    ("The" and "the" are different tokens).

    Args:
        sentence: the text to split.

    Returns:
        The tokens in sentence order, at least one.

    Raises:
        SentenceError: ``sentence`` is not a string, is empty or only whitespace, or
            holds characters that cannot be written as UTF-8 (such as bytes from the
            command line that were not UTF-8).

    Examples:
        >>> import selfattn as sa
        >>> sa.tokenize("The cat sat on the warm mat")
        ['The', 'cat', 'sat', 'on', 'the', 'warm', 'mat']
        >>> sa.tokenize("  Hello,   world. ")
        ['Hello,', 'world.']
    """
    if not isinstance(sentence, str):
        raise SentenceError(f"the sentence must be a string, not {type(sentence).__name__}")
    tokens = check_text(sentence).split()
    if not tokens:
        raise SentenceError("the sentence is empty: give at least one word")
    return tokens


def default_query_index(tokens: list[str]) -> int:
    """The seed's choice: the second token ("cat"), or the only token of a one-word sentence."""
    return 1 if len(tokens) > 1 else 0


def find_query(tokens: list[str], query: str | int | None) -> int:
    """Resolve a query given as a token or a 0-based position to its 0-based position.

    - None: the default (position 1, as the seed picks "cat").
    - an int: a 0-based position, 0 <= position < len(tokens); a negative one counts
      from the end, as Python's indexing does (-1: the last token).
    - a str: an exact, case-sensitive token; a repeated token selects its first
      occurrence. A string of digits that is not a token of the sentence is read as a
      0-based position, so "3" picks the second "the" of "the cat saw the dog", and "-1" the last.
    """
    if query is None:
        return default_query_index(tokens)
    if isinstance(query, str):
        check_text(query, "the query", QueryError)
        if query in tokens:
            return tokens.index(query)
        position = read_position(query)
        if position is None:
            raise QueryError(
                f"query token {query!r} is not in the sentence (tokens are case-sensitive): "
                f"choose one of {quote_tokens(tokens, 12, count=True)} or a 0-based position"
            )
        query = position
    if isinstance(query, bool) or not isinstance(query, int):
        raise QueryError(f"the query must be a token or a 0-based position, not {query!r}")
    n = len(tokens)
    if -n <= query < 0:
        return n + query
    if not 0 <= query < n:
        ranges = "position 0, or -1 from the end" if n == 1 else f"positions 0 to {n - 1}, or -{n} to -1 from the end"
        raise QueryError(f"query position {query} is out of range: the sentence has {n} token{'s' if n != 1 else ''} ({ranges})")
    return query


def read_position(text: str) -> int | None:
    """The position a query string names when it is not a token ("3", " 3 "), or None if it names none."""
    try:
        return int(text.strip())
    except ValueError:
        return None


def quote_tokens(tokens: list[str], limit: int, count: bool = False) -> str:
    """Distinct tokens quoted for a message: "'a', 'b', ..." after ``limit`` of them.

    With ``count``, a shortened list also says how many there are in all.
    """
    unique = list(dict.fromkeys(tokens))
    shown = ", ".join(repr(t) for t in unique[:limit])
    if len(unique) <= limit:
        return shown
    return shown + (f", ... ({len(unique)} in all)" if count else ", ...")


def missing_tokens(tokens: list[str], table) -> list[str]:
    """Distinct tokens, in sentence order, that ``table`` has no entry for."""
    return [t for t in dict.fromkeys(tokens) if t not in table]


def check_text(text: str, what: str = "the sentence", error: type[SentenceError | QueryError] = SentenceError) -> str:
    """``text`` itself if it can be written as UTF-8; otherwise ``error`` says where it cannot.

    On Linux, Python turns command-line bytes that are not UTF-8 into lone surrogates
    (U+DC80 to U+DCFF, PEP 383), which no tokenizer, terminal or file can take.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as failure:
        code, where = ord(text[failure.start]), f"at character {failure.start}"
        if 0xDC80 <= code <= 0xDCFF:
            raise error(f"{what} is not UTF-8 text (the byte 0x{code - 0xDC00:02x} {where}): give it in UTF-8") from None
        raise error(f"{what} is not valid text (a lone surrogate U+{code:04X} {where}): give it in UTF-8") from None
    return text
