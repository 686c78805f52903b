"""Inputs made to test one kind of head, instead of a sentence: the induction probe.

A decoder's induction heads show on random tokens repeated twice: on the second copy an
induction head looks at the token after the current token's earlier copy. The probe is
the model's BOS token if its tokenizer adds one, then r, then r again; its scores come
from ``decoder_roles.induction_probe_score``.
"""

from __future__ import annotations

import re

from dataclasses import dataclass

from selfattn.analysis.decoder_roles import induction_probe
from selfattn.errors import OptionError



@dataclass(frozen=True)
class Probe:
    """An input made to test one kind of head, instead of a sentence.

    Attributes:
        kind: which probe: "induction".
        length: the random tokens in one copy.
        seed: the seed that drew them.
        ids: every token id fed to the model: [first_id] + r + r.
        offset: tokens before the first copy (1 with a BOS token, else 0).
    """

    kind: str
    length: int
    seed: int
    ids: list[int]
    offset: int


def induction_probe_for(model, length: int, seed: int) -> Probe:
    """The induction probe for ``model``: its BOS token if the tokenizer adds one, then r, then r again.

    r is ``length`` distinct random ids from the vocabulary the tokenizer knows (an embedding
    row past it was never trained), special tokens left out.

    Args:
        model: a loaded decoder.
        length: the random tokens in one copy, at least 2.
        seed: the seed that draws them.

    Returns:
        The Probe.

    Raises:
        OptionError: the probe has more tokens than the model has positions.
    """
    tokenizer, bos = model.tokenizer, model.config.bos_id
    adds_bos = bos is not None and tokenizer is not None and int(tokenizer.encode("a").input_ids[0, 0]) == bos
    offset = int(adds_bos)
    positions = model.config.max_positions
    if offset + 2 * length > positions:
        raise OptionError(
            f"--probe-length {length} is too long for {model.name}: the probe would have {offset + 2 * length} tokens "
            f"and the model has {positions} positions, so give at most {(positions - offset) // 2}"
        )
    vocab = model.config.vocab_size if tokenizer is None else min(model.config.vocab_size, tokenizer.vocab_size)
    specials = () if tokenizer is None else (tokenizer.token_to_id(t) for t in tokenizer.special_tokens)
    avoid = {i for i in specials if i is not None and i < vocab}
    if tokenizer is not None:  # byte-fallback tokens (<0x0A> ...) show as bytes, not text: draw real pieces
        avoid |= {i for i in range(vocab) if re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", tokenizer.token(i))}
    ids = induction_probe(vocab, length, seed, first_id=bos if adds_bos else None, avoid=avoid)
    return Probe("induction", length, seed, ids.tolist(), offset)
