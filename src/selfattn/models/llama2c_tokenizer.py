"""llama2.c's tokenizer, read from its own binary file (tokenizer.bin, tok512.bin) and run here.

The file: an int32 max_token_length, then for every token a float32 score, an int32 byte
length and that many bytes (little-endian). The vocabulary size is not written in it;
llama2.c takes it from the checkpoint, and so may our caller (``vocab_size=``). Ids 0, 1,
2 are <unk>, <s> (BOS) and </s> (EOS), stored as "<unk>", "\\n<s>\\n" and "\\n</s>\\n";
ids 3-258 are the byte pieces <0x00> ... <0xFF>; the rest are ordinary pieces with a
space written as " " (sentencepiece's "▁" replaced).

Encoding follows llama2.c's run.c: BOS; the piece " " when the text is not empty (the
dummy prefix that makes "cat" at the start look like " cat" in the middle); one piece per
character, or its UTF-8 bytes as byte pieces (id = byte + 3) when the character is not a
piece; then, again and again, the adjacent pair whose joined text is a piece with the
highest score becomes that piece, the leftmost pair winning a tie. run.c rescans every
pair after each merge, O(n^2) per text; a heap of candidate pairs over a linked list
picks the same pair at each step in O(n log n).

Where we decide differently from run.c, none of which changes a result for tok512.bin or
Llama 2's tokenizer.bin (checked: no special or byte piece is the join of two pieces):
- Only ordinary pieces (ids >= 259) take part in merges, as in sentencepiece. run.c would
  join the text "<0xC3>" of a byte piece with a neighbour, or merge "<un" + "k>" into
  <unk>, so a text could produce a control token.
- Without a " " piece the dummy prefix is the byte piece <0x20> (run.c would write -1).
- A piece repeated in the file stands for its first id (run.c's binary search picks any).
Kept from run.c: a merge scored at or below -1e10 (its starting best) never happens.

Decoding follows run.c's decode: a piece right after BOS loses one leading space, a byte
piece is its byte, and the bytes of all pieces are joined and read as UTF-8 with invalid
sequences replaced by U+FFFD (a model can emit half a character). A continuation that does
not start with BOS keeps its leading space: it is meant to be appended to its prompt.
"""

from __future__ import annotations

import heapq
import struct
from dataclasses import dataclass
from pathlib import Path

from selfattn.errors import ModelError, OptionError
from selfattn.models.tokenizer import Encoded, TextTokenizer, as_text_list

UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
FIRST_BYTE_ID = 3  # ids 3-258 are the bytes 0x00-0xFF
FIRST_PIECE_ID = FIRST_BYTE_ID + 256
SPECIAL_NAMES = ("<unk>", "<s>", "</s>")
NEVER_MERGED = -1e10  # run.c's starting best score: a merge must beat it (exact in float32)


@dataclass(frozen=True)
class Llama2cVocabulary:
    """The contents of a llama2.c tokenizer file.

    Attributes:
        pieces: each token's bytes, in id order.
        scores: each token's float32 merge score (higher merges first).
        max_token_length: the header's bound on a piece's length in bytes.
    """

    pieces: tuple[bytes, ...]
    scores: tuple[float, ...]
    max_token_length: int


def read_llama2c_vocabulary(path: Path, vocab_size: int | None = None) -> Llama2cVocabulary:
    """Read a llama2.c tokenizer file, refusing anything that is not one with a one-line ModelError.

    Args:
        path: the tokenizer file (tokenizer.bin, tok512.bin).
        vocab_size: the number of tokens the checkpoint expects; None: as many as the file holds.

    Returns:
        The pieces, scores and header of the file.

    Raises:
        ModelError: the file cannot be read, is truncated, has stray bytes, a bad length,
            no byte pieces at ids 3-258, or a different number of tokens than ``vocab_size``.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise ModelError(f"cannot read the tokenizer {path}: {error.strerror or error}") from None
    where = f"{path} is not a llama2.c tokenizer"
    if len(data) < 4:
        raise ModelError(f"{where}: it has {len(data)} bytes, fewer than its 4-byte header")
    (max_token_length,) = struct.unpack_from("<i", data, 0)
    if not 0 < max_token_length <= len(data):
        raise ModelError(f"{where}: its header gives a longest token of {max_token_length} bytes")
    pieces, scores, offset = [], [], 4
    while offset < len(data):
        index = len(pieces)
        if len(data) - offset < 8:
            raise ModelError(_stray(where, len(data) - offset, index, vocab_size))
        score, length = struct.unpack_from("<fi", data, offset)
        if not 0 <= length <= max_token_length:
            raise ModelError(f"{where}: token {index} has length {length}, outside 0..{max_token_length} (its header)")
        if offset + 8 + length > len(data):
            raise ModelError(_stray(where, len(data) - offset, index, vocab_size))
        pieces.append(data[offset + 8: offset + 8 + length])
        scores.append(score)
        offset += 8 + length
    if vocab_size is not None and len(pieces) != vocab_size:
        raise ModelError(f"the tokenizer {path} has {len(pieces)} tokens but the checkpoint has {vocab_size}: "
                         "give the tokenizer the model was trained with")
    if len(pieces) < FIRST_PIECE_ID:
        raise ModelError(f"{where}: it has {len(pieces)} tokens, fewer than the {FIRST_PIECE_ID} of "
                         "<unk>, <s>, </s> and the 256 byte pieces")
    for byte in range(256):
        expected = f"<0x{byte:02X}>".encode()
        if pieces[FIRST_BYTE_ID + byte] != expected:
            raise ModelError(f"{where}: id {FIRST_BYTE_ID + byte} should be the byte piece {expected.decode()}, "
                             f"found {pieces[FIRST_BYTE_ID + byte]!r}")
    return Llama2cVocabulary(tuple(pieces), tuple(scores), max_token_length)


def _stray(where: str, left: int, index: int, vocab_size: int | None) -> str:
    if vocab_size is not None and index == vocab_size:
        return f"{where}: it has {left} stray bytes after its {index} tokens"
    return f"{where}: it ends {left} bytes into token {index} (truncated, or stray bytes at its end)"


class Llama2cTokenizer:
    """Texts -> padded ids with a llama2.c tokenizer file; used where selfattn uses a TextTokenizer.

    Every text starts with <s> (BOS), which counts towards max_length; an empty text is
    <s> alone, as llama2.c starts generating from it.

    Args:
        path: the tokenizer file.
        max_length: the most tokens a text may have, BOS included.
        pad_id: the id that fills padding (its attention mask is 0).
        padding_side: "left" (decoders: the newest token in the last column) or "right".
        vocab_size: the checkpoint's vocabulary size; when given, the file must have as many tokens.

    Raises:
        ModelError: the file is not a llama2.c tokenizer, or does not fit ``vocab_size``.
        OptionError: max_length is not positive or padding_side is neither "left" nor "right".

    Examples:
        >>> tok = Llama2cTokenizer("tok512.bin", max_length=512)  # doctest: +SKIP
        >>> tok.encode("the cat").input_ids.tolist()  # doctest: +SKIP
        [[1, 265, 280, 294]]
    """

    def __init__(self, path: Path | str, max_length: int, pad_id: int = 0, padding_side: str = "left",
                 *, vocab_size: int | None = None) -> None:
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
            raise OptionError(f"max_length must be a positive number of tokens, not {max_length!r}")
        if padding_side not in ("left", "right"):
            raise OptionError(f"padding_side must be 'left' or 'right', not {padding_side!r}")
        self.path = Path(path)
        self.vocabulary = read_llama2c_vocabulary(self.path, vocab_size)
        self.max_length = max_length
        self.pad_id = pad_id
        self.padding_side = padding_side
        pieces, scores = self.vocabulary.pieces, self.vocabulary.scores
        ordinary = range(len(pieces) - 1, FIRST_PIECE_ID - 1, -1)  # backwards: a repeated piece keeps its first id
        self._piece_ids = {pieces[i]: i for i in ordinary}
        # What a pair may become: ordinary pieces that can win a merge in run.c (NaN never does).
        self._merges = {piece: (i, scores[i]) for piece, i in self._piece_ids.items() if scores[i] > NEVER_MERGED}
        self._dummy_prefix = self._piece_ids.get(b" ", FIRST_BYTE_ID + 0x20)

    pad = TextTokenizer.pad
    check_lengths = TextTokenizer.check_lengths

    @property
    def vocab_size(self) -> int:
        """The number of tokens in the file."""
        return len(self.vocabulary.pieces)

    @property
    def bos_id(self) -> int:
        """<s>, which starts every encoded text (1)."""
        return BOS_ID

    @property
    def eos_id(self) -> int:
        """</s> (2); llama2.c's sampler itself stops at BOS."""
        return EOS_ID

    @property
    def special_tokens(self) -> frozenset[str]:
        """The names of the three specials as ``token`` writes them: <unk>, <s>, </s>."""
        return frozenset(SPECIAL_NAMES)

    @property
    def specials_note(self) -> str:
        """What the token count of a text includes besides the text."""
        return " (<s> included)"

    def encode(self, texts: str | list[str] | tuple[str, ...]) -> Encoded:
        """One text or a list of texts -> Encoded (a batch of one for a single text), each row BOS first.

        Args:
            texts: a string or a non-empty list of strings; a string may be empty.

        Returns:
            The rows' tokens as written by ``token``, their ids padded on ``padding_side``, and the mask.

        Raises:
            SentenceError: not strings, not UTF-8, or a text with more than max_length tokens.
        """
        texts = as_text_list(texts)
        rows = [self.encode_ids(text) for text in texts]
        self.check_lengths([len(row) for row in rows])
        return self.pad(rows)

    def encode_ids(self, text: str) -> list[int]:
        """One text -> its ids, BOS first, with no length limit.

        Args:
            text: the text; "" gives [BOS].

        Returns:
            The ids: BOS, then the merged pieces of " " + text.
        """
        if not text:
            return [BOS_ID]
        ids = [self._dummy_prefix]
        for character in text:
            encoded = character.encode("utf-8")
            found = self._piece_ids.get(encoded)
            ids.extend([found] if found is not None else (FIRST_BYTE_ID + byte for byte in encoded))
        return [BOS_ID] + self._merge(ids)

    def _merge(self, ids: list[int]) -> list[int]:
        """run.c's merge loop, with a heap: the best (score, then leftmost) pair first."""
        pieces = self.vocabulary.pieces
        after = list(range(1, len(ids) + 1))  # a linked list over the starting positions
        before = list(range(-1, len(ids) - 1))
        alive = [True] * len(ids)
        heap: list[tuple[float, int, int, int, int]] = []

        def offer(left: int) -> None:
            right = after[left]
            if right < len(ids) and ids[left] >= FIRST_PIECE_ID and ids[right] >= FIRST_PIECE_ID:
                merged = self._merges.get(pieces[ids[left]] + pieces[ids[right]])
                if merged is not None:
                    # Positions keep their order, so the smaller left start is the leftmost pair.
                    heapq.heappush(heap, (-merged[1], left, ids[left], ids[right], merged[0]))

        for left in range(len(ids) - 1):
            offer(left)
        while heap:
            _, left, left_id, right_id, merged_id = heapq.heappop(heap)
            right = after[left]
            if not alive[left] or right >= len(ids) or ids[left] != left_id or ids[right] != right_id:
                continue  # one side has merged since this pair was offered
            ids[left] = merged_id
            alive[right] = False
            after[left] = after[right]
            if after[right] < len(ids):
                before[after[right]] = left
            if before[left] >= 0:
                offer(before[left])
            offer(left)
        return [i for i, keep in zip(ids, alive) if keep]

    def token(self, token_id: int) -> str:
        """The vocabulary's piece for one id: ' cat', '<0x0A>', '<s>' ('<id N>' outside the vocabulary).

        Args:
            token_id: the id.

        Returns:
            The piece as text (a space is a plain " "; specials by name).
        """
        token_id = int(token_id)
        if not 0 <= token_id < self.vocab_size:
            return f"<id {token_id}>"
        if token_id < FIRST_BYTE_ID:
            return SPECIAL_NAMES[token_id]
        return self.vocabulary.pieces[token_id].decode("utf-8", errors="replace")

    def token_to_id(self, token: str) -> int | None:
        """The id of a piece as ``token`` writes it, or None when the vocabulary has no such piece.

        Args:
            token: a piece (' cat', '<0x0A>', '<s>').

        Returns:
            Its id, or None.
        """
        if token in SPECIAL_NAMES:
            return SPECIAL_NAMES.index(token)
        encoded = token.encode("utf-8", errors="surrogatepass")
        if encoded.startswith(b"<0x") and encoded in self.vocabulary.pieces[FIRST_BYTE_ID:FIRST_PIECE_ID]:
            return FIRST_BYTE_ID + int(encoded[3:5], 16)
        return self._piece_ids.get(encoded)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Ids -> text as llama2.c prints it, invalid UTF-8 replaced by U+FFFD.

        Args:
            ids: token ids; one right after BOS loses its leading space, so [BOS] + encode ids
                give the text back and a continuation without BOS keeps its space.
            skip_special_tokens: leave out <unk>, <s> and </s>; False writes them by name.

        Returns:
            The text.

        Raises:
            ModelError: an id outside the vocabulary.
        """
        out, previous = bytearray(), None
        for raw in ids:
            token_id = self._checked(raw)
            if token_id < FIRST_BYTE_ID:
                if not skip_special_tokens:
                    out += SPECIAL_NAMES[token_id].encode()
            elif token_id < FIRST_PIECE_ID:
                out.append(token_id - FIRST_BYTE_ID)
            else:
                piece = self.vocabulary.pieces[token_id]
                out += piece[1:] if previous == BOS_ID and piece.startswith(b" ") else piece
            previous = token_id
        return out.decode("utf-8", errors="replace")

    def continuation(self, prompt_ids: list[int], new_ids: list[int]) -> str:
        """The text of new_ids written after the prompt, as llama2.c prints it.

        A continuation of BOS alone (the empty prompt) loses its first leading space, as
        llama2.c's output does; after any other prompt the space stays, so prompt + text
        reads as one.

        Args:
            prompt_ids: the prompt's ids, BOS first.
            new_ids: the ids generated after it.

        Returns:
            The new text.
        """
        after_bos = bool(prompt_ids) and int(prompt_ids[-1]) == BOS_ID
        return self.decode([BOS_ID, *new_ids] if after_bos else list(new_ids))

    def readable(self, ids: list[int]) -> list[str]:
        """Each id as text on its own: ' cat', '\\n' for the byte 0x0A, '<0xE4>' for half a character.

        Args:
            ids: token ids.

        Returns:
            One string per id; specials by name, leading spaces kept, an id outside the vocabulary as '<id N>'.
        """
        shown = []
        for raw in ids:
            token_id = int(raw)
            if FIRST_BYTE_ID <= token_id < FIRST_PIECE_ID and token_id - FIRST_BYTE_ID < 0x80:
                shown.append(chr(token_id - FIRST_BYTE_ID))  # an ASCII byte is a whole character
            else:
                shown.append(self.token(token_id))
        return shown

    def _checked(self, raw) -> int:
        token_id = int(raw)
        if not 0 <= token_id < self.vocab_size:
            raise ModelError(f"token id {token_id} is not in the tokenizer {self.path} (ids 0 to {self.vocab_size - 1})")
        return token_id
