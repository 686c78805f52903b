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


class WordPieceTokenizer:
    """Texts -> padded ids.   max_length: the most tokens a text may have, specials included."""

    def __init__(self, tokenizer_file: Path, max_length: int, pad_id: int = 0) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise ModelError(f"reading the model's tokenizer needs the tokenizers package. {install_hint()}") from None
        self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.max_length = max_length
        self.pad_id = pad_id

    def encode(self, texts: str | list[str] | tuple[str, ...]) -> Encoded:
        """One text or a list of texts -> Encoded (a batch of one for a single text)."""
        texts = as_text_list(texts)
        encodings = self.tokenizer.encode_batch(texts)
        for index, encoding in enumerate(encodings):
            if len(encoding.ids) > self.max_length:
                which = "the text" if len(texts) == 1 else f"text {index}"
                raise SentenceError(
                    f"{which} has {len(encoding.ids)} tokens ([CLS] and [SEP] included); this model has "
                    f"{self.max_length} positions, so at most {self.max_length} tokens: shorten it or split it"
                )
        longest = max(len(e.ids) for e in encodings)
        input_ids = torch.full((len(texts), longest), self.pad_id, dtype=torch.long)  # (batch, seq)
        attention_mask = torch.zeros((len(texts), longest), dtype=torch.long)  # (batch, seq)
        for row, encoding in enumerate(encodings):
            input_ids[row, : len(encoding.ids)] = torch.tensor(encoding.ids, dtype=torch.long)
            attention_mask[row, : len(encoding.ids)] = 1
        return Encoded([list(e.tokens) for e in encodings], input_ids, attention_mask)


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
