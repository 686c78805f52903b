"""A GGUF file's tokenizer, rebuilt from its own ``tokenizer.ggml.*`` metadata with ``tokenizers``.

A GGUF file carries no tokenizer.json: the vocabulary, the merges and the special ids are
metadata keys, under llama.cpp's names. Two kinds of vocabulary are rebuilt here:

    tokenizer.ggml.model "gpt2"   byte-level BPE: token i of tokenizer.ggml.tokens is id i,
                                  tokenizer.ggml.merges ("a b") ranks the merges, and
                                  tokenizer.ggml.pre names how text is cut before merging
    tokenizer.ggml.model "llama"  SentencePiece read as BPE: a space is "▁", a leading one is
                                  added (tokenizer.ggml.add_space_prefix), bytes no token
                                  spells fall back to <0xNN>, and merges come from the
                                  tokens' scores (or from their order, for Gemma)

Tokens whose token_type is CONTROL or USER_DEFINED (and the UNKNOWN one) become added
tokens, so "<|im_start|>" in a text stays one token; tokenizer.ggml.add_bos_token and
add_eos_token become a post-processor.

Where llama.cpp and transformers' GGUF converter disagree, the file's own metadata wins:
each tokenizer.ggml.pre name splits text with llama.cpp's expressions for it, and the Llama 3
family looks a whole word up before merging (llama.cpp's ``ignore_merges``, as in Llama 3's
own tokenizer.json).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from selfattn.errors import ModelError, did_you_mean

UNKNOWN, CONTROL, USER_DEFINED = 2, 3, 4  # llama.cpp's token types (1 normal, 5 unused, 6 byte)
SPACE = "\u2581"  # SentencePiece's stand-in for a space

# The pieces of llama.cpp's split expressions, each a fact of how a vocabulary was trained.
_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LINES = r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|" + _LINES
QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|" + _LINES
_UPPER, _LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_LEAD = r"[^\r\n\p{L}\p{N}]?"
_TAIL = r" ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def _cased(suffix: str) -> str:
    """Words cut where lower case turns to upper (Mistral's tekken, GPT-4o)."""
    return f"{_LEAD}{_UPPER}*{_LOWER}+{suffix}|{_LEAD}{_UPPER}+{_LOWER}*{suffix}"


TEKKEN = _cased("") + r"|\p{N}|" + _TAIL
GPT4O = _cased(_CONTRACTIONS + "?") + r"|\p{N}{1,3}|" + _TAIL
BLOOM = r" ?[^(\s|.,!?…。，、।۔،)]+"


@dataclass(frozen=True)
class PreSplit:
    """How one tokenizer.ggml.pre cuts text: each expression in turn splits every piece further
    (matches and the text between them both kept), then the pieces' bytes are spelled byte-level.

    whole_words: a piece that is itself a token is kept whole instead of merged (``ignore_merges``).
    bos: whether BOS is added when the file has no tokenizer.ggml.add_bos_token.
    """

    expressions: tuple[str, ...]
    whole_words: bool = False
    bos: bool = False


_GPT2_SPLIT = PreSplit((GPT2,))
_DIGITS_SPLIT = PreSplit((r"\p{N}", GPT2))
_LLAMA3_SPLIT = PreSplit((LLAMA3,), whole_words=True, bos=True)
_QWEN2_SPLIT = PreSplit((QWEN2,))

PRE_SPLITS: dict[str, PreSplit] = {
    **dict.fromkeys(("gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais", "trillion", "granite-docling", "exaone4",
                     "jina-es", "jina-de", "jina-v2-es", "jina-v2-de", "gigachat", "a.x-4.0", "mellum"), _GPT2_SPLIT),
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"), _DIGITS_SPLIT),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"),
                    _LLAMA3_SPLIT),
    **dict.fromkeys(("dbrx", "smaug-bpe"), PreSplit((LLAMA3,))),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "megrez", "stablelm2", "hunyuan", "grok-2"), _QWEN2_SPLIT),
    **dict.fromkeys(("gpt-4o", "llama4", "minimax-m2"), PreSplit((GPT4O,))),
    **dict.fromkeys(("poro-chat", "bloom", "gpt3-finnish"), PreSplit((BLOOM,))),
    "viking": PreSplit((BLOOM, r"\p{N}")),
    "tekken": PreSplit((TEKKEN,), whole_words=True, bos=True),
    "falcon": PreSplit((r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]")),
    # llama.cpp's choice for "default", and for a file written before the key existed
    "default": PreSplit((r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")),
}

MODELS = ("gpt2", "llama")
_GEMMA = ("gemma", "gemma2", "gemma3")  # SentencePiece files whose scores do not rank their merges


def metadata_fields(reader) -> dict:
    """A GGUF file's metadata as plain Python values, through each field's ``contents()``.

    A key gguf cannot decode is left out, unless it is a tokenizer key: then its strings are read
    leniently (a byte that is not UTF-8 becomes U+FFFD), or the file is refused.

    Args:
        reader: the file's ``gguf.GGUFReader``.

    Returns:
        GGUF key -> str, int, float, bool or a list of those (tokenizer.ggml.tokens a list of str).

    Raises:
        ModelError: a tokenizer key that cannot be read at all.
    """
    fields = {}
    for key, field in reader.fields.items():
        try:
            fields[key] = field.contents()
        except Exception as error:  # noqa: BLE001 -- only the tokenizer's keys are needed whole
            if not key.startswith("tokenizer."):
                continue
            try:
                fields[key] = _lenient_strings(field)
            except Exception:  # noqa: BLE001
                raise ModelError(f"cannot read the GGUF key {key}: {type(error).__name__}: {error}") from None
    return fields


def _lenient_strings(field):
    texts = [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]
    return texts if len(field.types) > 1 else texts[0]


def special_ids(fields: Mapping[str, Any]) -> dict:
    """The special token ids a GGUF file names (tokenizer.ggml.bos_token_id, eos_token_id,
    eot_token_id, padding_token_id, unknown_token_id).

    Args:
        fields: GGUF key -> plain value, as ``metadata_fields`` returns them.

    Returns:
        {"bos", "eos", "eot", "pad", "unk"} -> an id, or None where the file names none, or one
            outside its vocabulary (which llama.cpp ignores too).
    """
    size = len(fields.get("tokenizer.ggml.tokens") or ())
    keys = {"bos": "bos_token_id", "eos": "eos_token_id", "eot": "eot_token_id",
            "pad": "padding_token_id", "unk": "unknown_token_id"}
    ids = {}
    for name, key in keys.items():
        value = fields.get(f"tokenizer.ggml.{key}")
        ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < size
        ids[name] = value if ok else None
    return ids


def tokenizer_from_metadata(fields: Mapping[str, Any]):
    """The ``tokenizers.Tokenizer`` a GGUF file's metadata describes.

    Args:
        fields: GGUF key -> plain value, as ``metadata_fields`` returns them.

    Returns:
        A tokenizer whose ids are the file's token ids; encoding adds BOS / EOS as the file asks.

    Raises:
        ModelError: in one line, naming the key: no token list, a tokenizer.ggml.model or
            tokenizer.ggml.pre this module does not build, or lists that do not fit together.
    """
    from tokenizers import Tokenizer

    model = fields.get("tokenizer.ggml.model")
    if model not in MODELS:
        state = "missing" if model is None else f"{model!r}"
        raise ModelError(f"tokenizer.ggml.model is {state}: selfattn builds GGUF tokenizers for 'gpt2' "
                         f"(byte-level BPE) and 'llama' (SentencePiece){did_you_mean(model, MODELS)}")
    tokens = _strings(fields, "tokenizer.ggml.tokens", required=True)
    types = _numbers(fields, "tokenizer.ggml.token_type", len(tokens), int) or [1] * len(tokens)
    tokens = [token or f"[EMPTY_{i}]" for i, token in enumerate(tokens)]  # as llama.cpp names an empty one
    if model == "gpt2":
        bpe, split = _byte_level(fields, tokens, types)
    else:
        bpe, split = _sentencepiece(fields, tokens), None
    tokenizer = Tokenizer(bpe)
    _dress(tokenizer, fields, split)
    _add_whole_tokens(tokenizer, tokens, types)
    _post_processor(tokenizer, fields, tokens, default_bos=split.bos if split else True)
    return tokenizer


def _byte_level(fields, tokens, types):
    """(the BPE model, the PreSplit): tokens as vocabulary, the file's merges, the split its pre names."""
    from tokenizers.models import BPE

    pre = fields.get("tokenizer.ggml.pre", "default")
    split = PRE_SPLITS.get(pre) if isinstance(pre, str) else None
    if split is None:
        raise ModelError(f"tokenizer.ggml.pre is {pre!r}, a split selfattn does not know{did_you_mean(pre, PRE_SPLITS)}"
                         f"; it knows {', '.join(sorted(PRE_SPLITS))}")
    spelling = _byte_spelling()
    alphabet = set(spelling)
    # a normal token is spelled in the byte alphabet; one that is not gets respelled (as transformers
    # does), while added tokens keep the text they match
    vocab_tokens = [t if ty in (CONTROL, USER_DEFINED, UNKNOWN) or set(t) <= alphabet
                    else "".join(spelling[b] for b in t.encode("utf-8")) for t, ty in zip(tokens, types)]
    vocab = _vocabulary(vocab_tokens)
    merges = _file_merges(fields, vocab)
    if merges is None:
        raise ModelError("a 'gpt2' GGUF tokenizer needs tokenizer.ggml.merges, and this file has none")
    return _bpe(BPE, vocab=vocab, merges=merges, ignore_merges=split.whole_words), split


def _sentencepiece(fields, tokens):
    """SentencePiece's merge-by-score as BPE: merges ranked by the merged token's score (Gemma: its position)."""
    from tokenizers.models import BPE

    gemma = fields.get("general.architecture") in _GEMMA
    if gemma:  # a token of spaces is stored with real spaces, but text reaches the model with "▁"
        tokens = [SPACE * len(t) if t.strip(" ") == "" else t for t in tokens]
    vocab = _vocabulary(tokens)
    merges = _file_merges(fields, vocab)
    if merges is None:
        if gemma:
            ranks = [-float(i) for i in range(len(tokens))]
        else:
            ranks = _numbers(fields, "tokenizer.ggml.scores", len(tokens), (int, float))
            if ranks is None:
                raise ModelError("a 'llama' GGUF tokenizer needs tokenizer.ggml.scores (or tokenizer.ggml.merges)")
        merges = _merges_by_score(tokens, vocab, ranks)
    unk = special_ids(fields)["unk"]  # used only for a byte the vocabulary has no <0xNN> token for
    return _bpe(BPE, vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True,
                unk_token=tokens[unk] if unk is not None else None)


def _merges_by_score(tokens, vocab, scores) -> list[tuple[str, str]]:
    """Every way to cut a token into two tokens, best first: the merged token's score, then the longer
    left part, then the longer right part, then the token's place in the file, then the parts' ids.

    SentencePiece joins the neighbouring pair whose union scores highest; ranking the merges so
    gives BPE the same choices (transformers' converter ranks them in this order too).
    """
    merges = []
    for place, token in enumerate(tokens):  # the vocabulary has no token twice, so place == vocab[token]
        cuts = [(token[:i], token[i:]) for i in range(1, len(token)) if token[:i] in vocab and token[i:] in vocab]
        for left, right in cuts:
            merges.append(((-scores[place], -len(left), -len(right), place, vocab[left], vocab[right]),
                           (left, right)))
    merges.sort(key=lambda m: m[0])
    return [pair for _, pair in merges]


def _dress(tokenizer, fields, split) -> None:
    """Normalizer, pre-tokenizer and decoder: byte-level for "gpt2", "▁" for spaces for "llama"."""
    from tokenizers import Regex, decoders, normalizers, pre_tokenizers

    if split is not None:
        cuts = [pre_tokenizers.Split(Regex(e), behavior="isolated") for e in split.expressions]
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [*cuts, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tokenizer.decoder = decoders.ByteLevel()
        return
    prefix = _flag(fields, "tokenizer.ggml.add_space_prefix", True)
    architecture = fields.get("general.architecture")
    if architecture in _GEMMA:
        tokenizer.normalizer = normalizers.Replace(" ", SPACE)
    elif architecture == "phi3":  # Phi-3 adds "▁" even before a leading space (transformers' converter agrees)
        steps = [normalizers.Prepend(SPACE)] if prefix else []
        tokenizer.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", SPACE)])
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement=SPACE, prepend_scheme="first" if prefix else "never", split=False)
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix and architecture not in _GEMMA:
        steps.append(decoders.Strip(content=" ", left=1))
    tokenizer.decoder = decoders.Sequence(steps)


def _add_whole_tokens(tokenizer, tokens, types) -> None:
    """Control and unknown tokens as special tokens, user-defined ones as plain added tokens: both
    are found whole in the text before any splitting, as llama.cpp does."""
    from tokenizers import AddedToken

    special = [AddedToken(t, normalized=False, special=True) for t, ty in zip(tokens, types) if ty in (CONTROL, UNKNOWN)]
    plain = [AddedToken(t, normalized=False, special=False) for t, ty in zip(tokens, types) if ty == USER_DEFINED]
    if special:
        tokenizer.add_special_tokens(special)
    if plain:
        tokenizer.add_tokens(plain)


def _post_processor(tokenizer, fields, tokens, default_bos: bool) -> None:
    """BOS before and EOS after every text, as tokenizer.ggml.add_bos_token / add_eos_token ask."""
    from tokenizers import processors

    ids = special_ids(fields)
    ends = {}
    for name, default in (("bos", default_bos), ("eos", False)):
        key = f"tokenizer.ggml.add_{name}_token"
        if _flag(fields, key, default):
            if ids[name] is None and key not in fields:  # only a default asked for it
                continue
            if ids[name] is None:
                raise ModelError(f"{key} is true but tokenizer.ggml.{name}_token_id names no token of the vocabulary")
            ends[name] = (tokens[ids[name]], ids[name])
    if not ends:
        return
    first = [ends["bos"][0]] if "bos" in ends else []
    last = [ends["eos"][0]] if "eos" in ends else []
    second = [f"{t}:1" for t in first], [f"{t}:1" for t in last]  # a pair's second text is type 1
    tokenizer.post_processor = processors.TemplateProcessing(
        single=[*first, "$A", *last], pair=[*first, "$A", *last, *second[0], "$B:1", *second[1]],
        special_tokens=list(ends.values()))


def _bpe(BPE, **settings):
    try:
        return BPE(**settings)
    except Exception as error:  # noqa: BLE001 -- tokenizers refuses merges of tokens the vocabulary lacks
        raise ModelError(f"the GGUF tokenizer's tokens and merges do not fit together: {error}") from None


def _vocabulary(tokens) -> dict[str, int]:
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        if token in vocab:
            raise ModelError(f"tokenizer.ggml.tokens lists {token!r} twice (ids {vocab[token]} and {index})")
        vocab[token] = index
    return vocab


def _file_merges(fields, vocab) -> list[tuple[str, str]] | None:
    merges = _strings(fields, "tokenizer.ggml.merges", required=False)
    if merges is None:
        return None
    pairs = []
    for index, merge in enumerate(merges):
        parts = merge.split(" ")
        if len(parts) != 2 or parts[0] not in vocab or parts[1] not in vocab:
            raise ModelError(f"tokenizer.ggml.merges[{index}] is {merge!r}, not two tokens of the vocabulary "
                             f"joined by one space")
        pairs.append((parts[0], parts[1]))
    return pairs


def _strings(fields, key, required: bool) -> list[str] | None:
    """The key's list of strings; None when it is absent and not required (the vocabulary is)."""
    value = fields.get(key)
    if value is None and not required:
        return None
    if value is None:
        raise ModelError(f"{key} is missing: a GGUF tokenizer needs the vocabulary as a list of strings")
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value) or (required and not value):
        raise ModelError(f"{key} must be a{' non-empty' if required else ''} list of strings, got {_sketch(value)}")
    return list(value)


def _sketch(value) -> str:
    """A short picture of a bad value for an error line."""
    if isinstance(value, (list, tuple)):
        kinds = sorted({type(v).__name__ for v in value})
        return f"a list of {len(value)} ({', '.join(kinds) or 'nothing'})"
    return f"{type(value).__name__} {value!r}"[:80]


def _numbers(fields, key, size: int, kind) -> list | None:
    value = fields.get(key)
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or len(value) != size or \
            not all(isinstance(v, kind) and not isinstance(v, bool) for v in value):
        raise ModelError(f"{key} must be a list of {size} numbers, one per token of tokenizer.ggml.tokens")
    return list(value)


def _flag(fields, key, default: bool) -> bool:
    value = fields.get(key, default)
    if not isinstance(value, bool):
        raise ModelError(f"{key} must be true or false, got {value!r}")
    return value


def _byte_spelling() -> list[str]:
    """Byte b -> the printable character byte-level BPE spells it with (GPT-2's table): printable
    Latin-1 bytes stand for themselves, the other 68 take the characters from U+0100 on, in order."""
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    spelling, extra = [], 0
    for b in range(256):
        if b in printable:
            spelling.append(chr(b))
        else:
            spelling.append(chr(0x100 + extra))
            extra += 1
    return spelling
