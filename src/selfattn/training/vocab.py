"""Character vocabularies for the models we train, written as a tokenizer.json.

A trained model must be usable like any other (``load_pretrained``, transformers), so its
vocabulary is a real tokenizer.json. Ours is character level: a BPE model from the
``tokenizers`` library with no merges, so every character is one token (newlines and
spaces included), an unseen character is ``<unk>``, and the Fuse decoder joins tokens back
without spaces. The induction task's vocabulary is an alphabet of symbols plus ``<s>``,
which its post-processor puts before every text (the task's sequences start with it).

    vocab = CharVocab.for_text(corpus)          # <unk> and every character of the corpus
    ids = vocab.encode("To be")                 # list of ints, one per character
    vocab.save(folder)                          # tokenizer.json + tokenizer_config.json
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from selfattn.errors import TrainingError

BOS, UNK = "<s>", "<unk>"
# The induction task's symbols: letters and digits, so a prompt such as "xQ3kxQ" can be typed.
SYMBOLS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


@dataclass(frozen=True)
class CharVocab:
    """A character vocabulary: specials first, then one id per character.

    Attributes:
        specials: the special tokens, ids 0 .. len(specials) - 1.
        chars: the characters, ids len(specials) onwards.
        add_bos: the tokenizer puts ``<s>`` before every text.
    """

    specials: tuple[str, ...]
    chars: str
    add_bos: bool = False

    @classmethod
    def for_text(cls, text: str) -> "CharVocab":
        """``<unk>`` and every distinct character of ``text``, sorted."""
        return cls((UNK,), "".join(sorted(set(text))))

    @classmethod
    def for_induction(cls, symbols: int) -> "CharVocab":
        """``<s>``, ``<unk>`` and the first ``symbols`` of SYMBOLS; texts start with ``<s>``."""
        if not 2 <= symbols <= len(SYMBOLS):
            raise TrainingError(f"the induction task has 2 to {len(SYMBOLS)} symbols, got {symbols}")
        return cls((BOS, UNK), SYMBOLS[:symbols], add_bos=True)

    @property
    def size(self) -> int:
        """The number of ids."""
        return len(self.specials) + len(self.chars)

    @property
    def first_char(self) -> int:
        """The id of the first character (ids below it are specials)."""
        return len(self.specials)

    @property
    def bos_id(self) -> int | None:
        """The id of ``<s>``, or None."""
        return self.specials.index(BOS) if BOS in self.specials else None

    @property
    def unk_id(self) -> int:
        """The id of ``<unk>``."""
        return self.specials.index(UNK)

    def encode(self, text: str) -> list[int]:
        """Characters -> ids (no ``<s>``); unseen characters become ``<unk>``."""
        lookup = {c: i + self.first_char for i, c in enumerate(self.chars)}
        return [lookup.get(c, self.unk_id) for c in text]

    def encode_tensor(self, text: str) -> torch.Tensor:
        """A long text -> (len,) int64 ids, through a table over code points (fast for megabytes)."""
        raw = bytearray(text.encode("utf-32-le"))
        codes = torch.frombuffer(raw, dtype=torch.int32).long() if raw else torch.zeros(0, dtype=torch.int64)  # (len,)
        table = torch.full((int(codes.max()) + 1 if len(codes) else 1,), self.unk_id, dtype=torch.int64)
        for i, c in enumerate(self.chars):
            if ord(c) < len(table):
                table[ord(c)] = i + self.first_char
        return table[codes]

    def token(self, token_id: int) -> str:
        """One id's token: a special's name or the character."""
        return self.specials[token_id] if token_id < self.first_char else self.chars[token_id - self.first_char]

    def decode(self, ids) -> str:
        """Ids -> text; specials are left out."""
        first = self.first_char
        return "".join(self.chars[i - first] for i in map(int, ids) if i >= first)

    def tokenizer_json(self) -> str:
        """The vocabulary as a ``tokenizers`` Tokenizer, serialised (tokenizer.json)."""
        try:
            from tokenizers import AddedToken, Tokenizer, decoders, models, processors
        except ImportError:
            raise TrainingError("training writes a tokenizer.json with the tokenizers package: "
                                "python -m pip install 'tokenizers>=0.19'") from None

        vocab = {token: i for i, token in enumerate([*self.specials, *self.chars])}
        tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
        tokenizer.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in self.specials])
        tokenizer.decoder = decoders.Fuse()
        if self.add_bos:
            tokenizer.post_processor = processors.TemplateProcessing(
                single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, self.bos_id)]
            )
        return tokenizer.to_str()

    def save(self, folder: Path) -> None:
        """tokenizer.json and tokenizer_config.json (read by transformers' PreTrainedTokenizerFast)."""
        (folder / "tokenizer.json").write_text(self.tokenizer_json(), encoding="utf-8")
        settings = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": UNK, "model_max_length": 1 << 30,
                    "clean_up_tokenization_spaces": False}
        if self.add_bos:
            settings.update(bos_token=BOS, add_bos_token=True)
        (folder / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")

    def to_json(self) -> dict:
        """The vocabulary as JSON data (kept in the run's training.json)."""
        return {"specials": list(self.specials), "chars": self.chars, "add_bos": self.add_bos}

    @classmethod
    def from_json(cls, data: dict) -> "CharVocab":
        """The inverse of ``to_json``."""
        return cls(tuple(data["specials"]), data["chars"], bool(data["add_bos"]))
