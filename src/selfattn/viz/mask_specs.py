"""The --mask specs of ``selfattn plot --kind mask``, read once for both of its pictures.

A spec is NAME or NAME:ARGUMENT. Over a sentence (``commands.mask_picture``) the mask is a
bool matrix of its tokens; with --length N (``spec_mask`` here) it is one of the
structured masks of ``selfattn.masks`` over N positions, whose block map is worked out in
closed form, so no N x N tensor is made even at N = 65536.

    causal                   no query sees a later key (top-left, as torch's is_causal)
    causal-bottom-right[:P]  P cached keys before the queries (default 3)
    sliding-window[:W]       causal window of W tokens, the query included (default 3)
    padding[:L]              the first L keys are real (default all but 2)
    documents[:A,B,...]      packed documents of A, B, ... tokens (default two halves);
                             AxK is K documents of A tokens (documents:512x8)
    prefix-lm[:P]            the first P tokens see each other both ways, causal after
                             (default half)
    none                     every query sees every key
"""

from __future__ import annotations

from selfattn.errors import OptionError
from selfattn.masks import CausalMask, DocumentMask, PaddingMask, SlidingWindowMask, StructuredMask

SPEC_NAMES = ("causal, causal-bottom-right[:P], sliding-window[:W], padding[:L], documents[:A,B,...], "
              "prefix-lm[:P] or none")


def split_spec(spec: str) -> tuple[str, int | None, str | None]:
    """(name, the number after ':' or None, the raw text after ':' or None) of a --mask spec."""
    name, colon, argument = spec.partition(":")
    value = None
    if colon and name != "documents":
        if not _whole(argument):
            raise OptionError(f"the number after ':' in --mask {spec!r} must be a whole number >= 0")
        value = int(argument)
    return name, value, argument if colon else None


def _whole(text: str) -> bool:
    """A whole number in ASCII digits ('²' is a digit to str.isdigit, not to int), short enough for int()."""
    return text.isascii() and text.isdigit() and len(text) <= 18


def unknown_spec(spec: str) -> OptionError:
    return OptionError(f"unknown mask {spec!r}: use {SPEC_NAMES}")


def document_lengths(spec: str, argument: str | None, n: int, where: str = "the sentence has") -> list[int]:
    """The lengths in documents:A,B,... (AxK: K documents of A; default two halves); they must add up to n."""
    if argument is None:
        return [n - n // 2, n // 2] if n > 1 else [n]
    parts = []  # (length, how many documents of it)
    for part in argument.split(","):
        size, times, count = part.partition("x")
        if not (_whole(size) and int(size) > 0 and (not times or (_whole(count) and int(count) > 0))):
            raise OptionError(f"--mask {spec!r}: give document lengths as whole numbers >= 1, e.g. documents:3,4 "
                              "(or documents:512x8 for 8 documents of 512)")
        parts.append((int(size), int(count) if times else 1))
    total = sum(size * count for size, count in parts)
    if total != n:
        raise OptionError(f"--mask {spec!r}: the documents hold {total} tokens, {where} {n}")
    return [size for size, count in parts for _ in range(count)]


def prefix_lm_mask(n: int, prefix: int) -> StructuredMask:
    """Bidirectional over the first ``prefix`` positions, causal after: j <= i or j < prefix.   (1, 1, n, n)"""
    return CausalMask(n) | PaddingMask([prefix], n)  # a key before the prefix's end is visible to every query


def spec_mask(spec: str, length: int) -> tuple[StructuredMask, str]:
    """(the structured mask of a --mask spec over ``length`` positions, what it is in words)."""
    name, value, argument = split_spec(spec)
    n = length
    if name == "none" and argument is None:
        return SlidingWindowMask(n, left=None, right=None), f"No mask: each of {n} queries sees every key"
    if name == "causal" and argument is None:
        return CausalMask(n), f"Causal mask (top-left) over {n} tokens"
    if name == "causal-bottom-right":
        past = 3 if value is None else value
        return (CausalMask(n, n + past, align="bottom_right"),
                f"Causal mask (bottom-right): {n} queries after {past} cached keys")
    if name == "sliding-window":
        window = 3 if value is None else value
        if window < 1:
            raise OptionError(f"the sliding window must hold at least 1 token, got {window}")
        return SlidingWindowMask(n, left=window - 1), f"Causal sliding window of {window} tokens over {n}"
    if name == "padding":
        real = max(n - 2, 1) if value is None else value
        if not 0 <= real <= n:
            raise OptionError(f"padding:{real} needs a length from 0 to --length {n}")
        return PaddingMask([real], n), f"Padding mask: the first {real} of {n} keys are real"
    if name == "prefix-lm":
        prefix = n // 2 if value is None else value
        if not 0 <= prefix <= n:
            raise OptionError(f"prefix-lm:{prefix} needs a prefix from 0 to --length {n}")
        return prefix_lm_mask(n, prefix), f"Prefix-LM over {n} tokens: the first {prefix} see both ways, then causal"
    if name == "documents":
        lengths = document_lengths(spec, argument, n, where="--length is")
        return DocumentMask(lengths), f"{len(lengths)} packed documents ({_lengths_text(lengths)} tokens)"
    raise unknown_spec(spec)


def _lengths_text(lengths: list[int]) -> str:
    if len(set(lengths)) == 1:
        return f"{lengths[0]} each"
    shown = ", ".join(map(str, lengths[:6]))
    return shown + (", ..." if len(lengths) > 6 else "")
