"""WordPiece tokens for a pretrained BERT model, read from its own tokenizer.json.

The model's tokenizer (lower-casing, accent handling, CJK splitting, WordPiece with "##"
continuation pieces, [CLS] ... [SEP] around each text) is data in tokenizer.json; the
``tokenizers`` library runs it. The shipped file pads and truncates every input to 128
tokens. We switch both off on purpose: truncating would silently drop the end of a long
text, and padding to 128 would spend compute on [PAD]. We pad a batch ourselves to its
longest text, and refuse a text longer than the model's learned positions (512 for
all-MiniLM-L6-v2) instead of cutting it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from selfattn.errors import ModelError, SentenceError
from selfattn.models.files import install_hint
from selfattn.pipeline.tokenize import check_text


@dataclass(frozen=True)
class Encoded:
    """A padded batch of token ids.   input_ids / attention_mask: (batch, seq)"""

    tokens: list[list[str]]  # WordPiece tokens per text, [CLS] and [SEP] included, no padding
    input_ids: torch.Tensor  # (batch, seq) int64, padded with pad_id
    attention_mask: torch.Tensor  # (batch, seq) int64: 1 = a real token, 0 = padding

    @property
    def lengths(self) -> list[int]:
        return [len(t) for t in self.tokens]


class TextTokenizer:
    """Texts -> padded ids with a model's own tokenizer.json.   max_length: the most tokens a text may have.

    The specials the file's post-processor adds (BERT's [CLS] ... [SEP], Llama's
    <|begin_of_text|>) count towards max_length. padding_side "right" suits encoders
    (BERT), "left" decoders: the newest token of every row sits in the last column, so
    generation appends one column for the whole batch.
    """

    def __init__(self, tokenizer_file: Path, max_length: int, pad_id: int = 0, padding_side: str = "right") -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise ModelError(f"reading the model's tokenizer needs the tokenizers package. {install_hint()}") from None
        try:
            self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
        except Exception as error:  # a user's file that tokenizers cannot read is bad input, not our bug
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise ModelError(f"cannot read the tokenizer {tokenizer_file}: {reason}") from None
        self._settle(max_length, pad_id, padding_side)

    @classmethod
    def from_tokenizer(cls, tokenizer, max_length: int, pad_id: int = 0, padding_side: str = "right") -> TextTokenizer:
        """The same around a ``tokenizers.Tokenizer`` built in memory (a GGUF file's, from its metadata)."""
        made = cls.__new__(cls)
        made.tokenizer = tokenizer
        made._settle(max_length, pad_id, padding_side)
        return made

    def _settle(self, max_length: int, pad_id: int, padding_side: str) -> None:
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.max_length = max_length
        self.pad_id = pad_id
        self.padding_side = padding_side

    @property
    def vocab_size(self) -> int:
        """Ids the tokenizer knows, added tokens included."""
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, texts: str | list[str] | tuple[str, ...]) -> Encoded:
        """One text or a list of texts -> Encoded (a batch of one for a single text)."""
        texts = as_text_list(texts)
        encodings = self.tokenizer.encode_batch(texts)
        self.check_lengths([len(e.ids) for e in encodings])
        return self.pad([list(e.ids) for e in encodings], [list(e.tokens) for e in encodings])

    def check_lengths(self, lengths: list[int]) -> None:
        """Refuse a text of more tokens than max_length, naming it (when there are several) and its count.

        Args:
            lengths: each text's token count, specials included.

        Raises:
            SentenceError: a text is too long for the model's positions.
        """
        for index, length in enumerate(lengths):
            if length > self.max_length:
                which = "the text" if len(lengths) == 1 else f"text {index}"
                raise SentenceError(
                    f"{which} has {length} tokens{self.specials_note}; this model has "
                    f"{self.max_length} positions, so at most {self.max_length} tokens: shorten it or split it"
                )

    def pad(self, rows: list[list[int]], tokens: list[list[str]] | None = None) -> Encoded:
        """Lists of ids -> one padded batch on this tokenizer's side (tokens looked up if not given)."""
        if tokens is None:
            tokens = [[self.token(i) for i in row] for row in rows]
        longest = max(len(row) for row in rows)
        input_ids = torch.full((len(rows), longest), self.pad_id, dtype=torch.long)  # (batch, seq)
        attention_mask = torch.zeros((len(rows), longest), dtype=torch.long)  # (batch, seq)
        for index, row in enumerate(rows):
            span = slice(0, len(row)) if self.padding_side == "right" else slice(longest - len(row), longest)
            input_ids[index, span] = torch.tensor(row, dtype=torch.long)
            attention_mask[index, span] = 1
        return Encoded(tokens, input_ids, attention_mask)

    def token(self, token_id: int) -> str:
        """The vocabulary's string for one id (byte-level BPE shows a space as 'Ġ')."""
        token = self.tokenizer.id_to_token(int(token_id))
        return f"<id {token_id}>" if token is None else token

    def token_to_id(self, token: str) -> int | None:
        """The id of a vocabulary string, or None when it is not one."""
        return self.tokenizer.token_to_id(token)

    def continuation(self, prompt_ids: list[int], new_ids: list[int]) -> str:
        """The text of new_ids written after the prompt: here they decode on their own."""
        return self.decode(new_ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Ids -> text, as the tokenizer's decoder joins them."""
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def readable(self, ids: list[int]) -> list[str]:
        """Each id decoded on its own: ' cat' where the vocabulary says 'Ġcat'."""
        return [self.tokenizer.decode([int(i)], skip_special_tokens=False) for i in ids]

    @property
    def special_tokens(self) -> frozenset[str]:
        """The vocabulary's special tokens ([CLS], <s>, <|endoftext|> ...), as written."""
        added = self.tokenizer.get_added_tokens_decoder().values()
        return frozenset(token.content for token in added if token.special)

    @property
    def specials_note(self) -> str:
        return ""


class WordPieceTokenizer(TextTokenizer):
    """A BERT tokenizer: WordPiece with [CLS] ... [SEP] around each text, padded on the right."""

    def __init__(self, tokenizer_file: Path, max_length: int, pad_id: int = 0) -> None:
        super().__init__(tokenizer_file, max_length, pad_id, padding_side="right")

    @property
    def specials_note(self) -> str:
        return " ([CLS] and [SEP] included)"


def as_text_list(texts) -> list[str]:
    """A string or a non-empty list/tuple of strings -> list of strings; anything else is refused."""
    if isinstance(texts, str):
        return [check_text(texts, "the text")]
    if not isinstance(texts, (list, tuple)):
        raise SentenceError(f"give a string or a list of strings, got {type(texts).__name__}")
    if not texts:
        raise SentenceError("give at least one text")
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise SentenceError(f"text {index} is a {type(text).__name__}, not a string")
        check_text(text, "the text" if len(texts) == 1 else f"text {index}")
    return list(texts)
