"""How a token is written on a plot, a page or a table: its readable form, one rule for every vocabulary.

A byte-level BPE vocabulary (GPT-2, Llama 3, Qwen2) stores ' cat' as 'Ġcat': each byte is
mapped to a printable stand-in. Labels show what the token reads as instead, with the
space kept visible, so a word and the same word after a space stay apart:

    'Ġcat'  (reads ' cat')    ->  '␣cat'
    'Ċ'     (reads '\\n')      ->  '↵'
    'Ã'     (one byte of 'é') ->  '<0xC3>'   a byte that is no character on its own
    '[CLS]', '##s', '<s>'     ->  themselves (WordPiece tokens and specials read as written)

No import beyond the standard library, so the text renderers can use it too.
"""

from __future__ import annotations

from functools import lru_cache

REPLACEMENT = "\ufffd"  # what decoding a lone byte of a multi-byte character gives
_VISIBLE = str.maketrans({" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"})


@lru_cache(maxsize=1)
def _byte_of_stand_in() -> dict[str, int]:
    """GPT-2's byte-level alphabet read backwards: the printable stand-in character -> its byte.

    Printable Latin-1 bytes stand for themselves; the other 68 bytes are given the
    characters from U+0100 on, in byte order (so the space 0x20 is 'Ġ', U+0120).
    """
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {chr(b): b for b in kept}
    shifted = 0
    for b in range(256):
        if b not in table.values():
            table[chr(256 + shifted)] = b
            shifted += 1
    return table


def token_label(token: str, readable: str | None = None) -> str:
    """The label of one token: its readable form with whitespace made visible.

    Args:
        token: the token as the vocabulary writes it ('Ġcat', '##s', '[CLS]').
        readable: the token decoded alone (' cat'); None: the token itself.

    Returns:
        The label: '␣cat'; a token whose bytes are not a whole character alone gives
        its bytes, '<0xC3>'; control characters are escaped.
    """
    text = token if readable is None else readable
    if REPLACEMENT in text and REPLACEMENT not in token:
        stand_ins = _byte_of_stand_in()
        if token and all(ch in stand_ins for ch in token):
            return "".join(f"<0x{stand_ins[ch]:02X}>" for ch in token)
        return token  # another vocabulary's byte token ('<0xE6>' in SentencePiece) reads well as written
    if not text:
        return token
    text = text.translate(_VISIBLE)
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def token_labels(tokens: list[str], readable: list[str] | None = None) -> list[str]:
    """``token_label`` of every token; ``readable`` None labels each token as it is written."""
    if readable is None:
        return [token_label(t) for t in tokens]
    return [token_label(t, r) for t, r in zip(tokens, readable)]
