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

``check_spec`` refuses a spec before anything is built (plain Python: the command line
runs it before torch loads); the masks are imported when one is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from selfattn.errors import OptionError, did_you_mean

if TYPE_CHECKING:
    from selfattn.masks import StructuredMask

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


MASK_NAMES = ("causal", "causal-bottom-right", "sliding-window", "padding", "documents", "prefix-lm", "none")


def unknown_spec(spec: str) -> OptionError:
    return OptionError(f"unknown mask {spec!r}{did_you_mean(spec.partition(':')[0], MASK_NAMES)}: use {SPEC_NAMES}")


def check_spec(spec: str, n: int | None = None, over: str = "sentence") -> tuple[str, int | None, str | None]:
    """Refuse a --mask spec that names no mask, or whose number does not fit ``n`` positions.

    Args:
        spec: NAME or NAME:ARGUMENT.
        n: the positions the mask covers; None checks the spec's form alone (a model's
            tokens are known only once it has read the text).
        over: what the positions are, for the messages: "sentence" (its tokens) or
            "length" (--length).

    Returns:
        ``split_spec``'s (name, number, argument).

    Raises:
        OptionError: an unknown name, a number that is not whole, a window below 1, a
            padding length or prefix outside 0..n, or documents that do not add up to n.
    """
    name, value, argument = split_spec(spec)
    if name in ("none", "causal") and argument is None:
        return name, value, argument
    if name not in ("causal-bottom-right", "sliding-window", "padding", "prefix-lm", "documents"):
        raise unknown_spec(spec)
    if name == "sliding-window" and value is not None and value < 1:
        raise OptionError(f"the sliding window must hold at least 1 token, got {value}")
    if name == "documents":
        document_lengths(spec, argument, n, where="the sentence has" if over == "sentence" else "--length is")
    elif n is not None and name in ("padding", "prefix-lm") and value is not None and not 0 <= value <= n:
        what = "a length" if name == "padding" else "a prefix"
        range_end = f"the {n} tokens of the sentence" if over == "sentence" else f"--length {n}"
        raise OptionError(f"{name}:{value} needs {what} from 0 to {range_end}")
    return name, value, argument


def document_lengths(spec: str, argument: str | None, n: int | None, where: str = "the sentence has") -> list[int]:
    """The lengths in documents:A,B,... (AxK: K documents of A; default two halves); they must add up to n.

    With n None only their form is checked, and the lengths are returned as written.
    """
    if argument is None:
        return [] if n is None else [n - n // 2, n // 2] if n > 1 else [n]
    parts = []  # (length, how many documents of it)
    for part in argument.split(","):
        size, times, count = part.partition("x")
        if not (_whole(size) and int(size) > 0 and (not times or (_whole(count) and int(count) > 0))):
            raise OptionError(f"--mask {spec!r}: give document lengths as whole numbers >= 1, e.g. documents:3,4 "
                              "(or documents:512x8 for 8 documents of 512)")
        parts.append((int(size), int(count) if times else 1))
    total = sum(size * count for size, count in parts)
    if n is not None and total != n:
        raise OptionError(f"--mask {spec!r}: the documents hold {total} tokens, {where} {n}")
    return [size for size, count in parts for _ in range(count)]


def prefix_lm_mask(n: int, prefix: int) -> StructuredMask:
    """Bidirectional over the first ``prefix`` positions, causal after: j <= i or j < prefix.   (1, 1, n, n)"""
    from selfattn.masks import CausalMask, PaddingMask

    return CausalMask(n) | PaddingMask([prefix], n)  # a key before the prefix's end is visible to every query


def spec_mask(spec: str, length: int) -> tuple[StructuredMask, str]:
    """(the structured mask of a --mask spec over ``length`` positions, what it is in words)."""
    from selfattn.masks import CausalMask, DocumentMask, PaddingMask, SlidingWindowMask

    name, value, argument = check_spec(spec, length, over="length")
    n = length
    if name == "none":
        return SlidingWindowMask(n, left=None, right=None), f"No mask: each of {n} queries sees every key"
    if name == "causal":
        return CausalMask(n), f"Causal mask (top-left) over {n} tokens"
    if name == "causal-bottom-right":
        past = 3 if value is None else value
        return (CausalMask(n, n + past, align="bottom_right"),
                f"Causal mask (bottom-right): {n} queries after {past} cached keys")
    if name == "sliding-window":
        window = 3 if value is None else value
        return SlidingWindowMask(n, left=window - 1), f"Causal sliding window of {window} tokens over {n}"
    if name == "padding":
        real = max(n - 2, 1) if value is None else value
        return PaddingMask([real], n), f"Padding mask: the first {real} of {n} keys are real"
    if name == "prefix-lm":
        prefix = n // 2 if value is None else value
        return prefix_lm_mask(n, prefix), f"Prefix-LM over {n} tokens: the first {prefix} see both ways, then causal"
    lengths = document_lengths(spec, argument, n, where="--length is")
    return DocumentMask(lengths), f"{len(lengths)} packed documents ({_lengths_text(lengths)} tokens)"


def spec_keys(spec: str, length: int) -> int:
    """The keys a --mask spec's block map has over ``length`` queries: causal-bottom-right adds its cached keys."""
    name, value, _ = split_spec(spec)
    return length + (3 if value is None else value) if name == "causal-bottom-right" else length


def _lengths_text(lengths: list[int]) -> str:
    if len(set(lengths)) == 1:
        return f"{lengths[0]} each"
    shown = ", ".join(map(str, lengths[:6]))
    return shown + (", ..." if len(lengths) > 6 else "")
