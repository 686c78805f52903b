"""llama2.c's tokenizer format, against references written here rather than our own output.

1. Ids worked out by hand from tok512.bin's pieces and scores (the derivations are in comments).
2. A brute-force encoder written here from the format and run.c's rules: it reads the file
   with its own reader, keeps the text as a list of strings, rescans every pair after every
   merge and takes max() over (score, -position). The library uses a heap over a linked list
   of ids; the two must agree on shipped text, hypothesis text and random vocabularies.
3. decode(encode(text)) gives the text back, and the pieces of an encoding spell " " + text.
4. Hand-made files where the order of merges decides the answer.
"""

from __future__ import annotations

import itertools
import math
import random
import struct
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from selfattn.errors import ModelError, OptionError, SentenceError
from selfattn.models.files import model_folder
from selfattn.models.llama2c_tokenizer import Llama2cTokenizer

TOK512 = model_folder("stories260K") / "tok512.bin"


# --- the reference: its own reader and a brute-force encoder ----------------------------------


def reference_vocabulary(path: Path) -> tuple[list[bytes], list[float]]:
    """The file read in one pass with struct alone: header, then (score, length, bytes) to the end."""
    raw = path.read_bytes()
    pieces, scores, at = [], [], 4
    while at < len(raw):
        score, length = struct.unpack("<fi", raw[at:at + 8])
        pieces.append(raw[at + 8:at + 8 + length])
        scores.append(score)
        at += 8 + length
    return pieces, scores


def reference_encode(text: str, pieces: list[bytes], scores: list[float]) -> list[int]:
    """run.c's rules, slowly: the text as strings, every pair rescanned after every merge.

    A byte that fell back is kept as a 1-byte ``bytes`` object, which never merges;
    ordinary pieces are the ids from 259 on (the first of a repeated piece wins).
    """
    words: dict[str, int] = {}
    for index in range(len(pieces) - 1, 258, -1):
        words[pieces[index].decode("utf-8")] = index
    if text == "":
        return [1]
    symbols: list = [" " if " " in words else b" "]
    for character in text:
        symbols += [character] if character in words else [bytes([b]) for b in character.encode("utf-8")]
    while True:
        candidates = [
            (scores[words[a + b]], -i) for i, (a, b) in enumerate(itertools.pairwise(symbols))
            if isinstance(a, str) and isinstance(b, str) and a + b in words and scores[words[a + b]] > -1e10
        ]
        if not candidates:
            break
        _, minus_i = max(candidates)  # the highest score; among equals the largest -i, the leftmost
        i = -minus_i
        symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]
    return [1] + [words[s] if isinstance(s, str) else s[0] + 3 for s in symbols]


def write_tokenizer(path: Path, extra: list[tuple[str, float]], header: int | None = None) -> Path:
    """A llama2.c file: <unk>, <s>, </s>, the 256 byte pieces (score 0), then ``extra``."""
    entries = [(b"<unk>", 0.0), (b"\n<s>\n", 0.0), (b"\n</s>\n", 0.0)]
    entries += [(f"<0x{b:02X}>".encode(), 0.0) for b in range(256)]
    entries += [(piece.encode("utf-8"), score) for piece, score in extra]
    longest = max(len(p) for p, _ in entries) if header is None else header
    path.write_bytes(struct.pack("<i", longest) + b"".join(struct.pack("<fi", s, len(p)) + p for p, s in entries))
    return path


@pytest.fixture(scope="module")
def tok() -> Llama2cTokenizer:
    return Llama2cTokenizer(TOK512, max_length=4096)


@pytest.fixture(scope="module")
def vocabulary() -> tuple[list[bytes], list[float]]:
    return reference_vocabulary(TOK512)


def ids(tokenizer: Llama2cTokenizer, text: str) -> list[int]:
    return tokenizer.encode(text).input_ids[0].tolist()


# --- hand-checked ids ------------------------------------------------------------------------

# tok512.bin's pieces 259-409 are merges scored 0, -1, -2, ... in id order; 410-511 single
# characters; 3-258 the bytes. Each case starts [BOS=1, " "=410, one piece per character]:
# - "a": " " (410) + "a" (412); " a" is piece 261, the only pair -> [1, 261].
# - "the cat": " t h e _ c a t". Pairs that are pieces: " t" 259 (score 0), "he" 260 (-1),
#   " c" 280 (-21), "at" 294 (-35). " t" first, then "he"; now " t"+"he" = " the" 265 (-6)
#   beats " c" and "at"; then " c", then "at"; " c"+"at" = " cat" is no piece -> [1, 265, 280, 294].
# - "\n": no piece "\n", so its byte 0x0A is id 10 + 3 = 13; " \n" is no piece -> [1, 410, 13].
# - "ü": no piece; UTF-8 C3 BC -> ids 0xC3 + 3 = 198 and 0xBC + 3 = 191 -> [1, 410, 198, 191].
# - "é": piece 485; " é" is no piece -> [1, 410, 485].
# - "Once upon a time", merges by score: " t" 259 (0), " a" 261 (-2), "im" 288 (-29), "on" 289
#   (-30), " u" 318, " O" 319, " O"+"n" = " On" 321, "ce" 331, " u"+"p" = " up" 350, "im"+"e" =
#   "ime" 369, " t"+"ime" = " time" 378, " On"+"ce" = " Once" 403, " up"+"on" = " upon" 407 (-148);
#   " Once upon" is no piece -> [1, 403, 407, 261, 378].
HAND_CHECKED = [
    ("", [1]),
    ("a", [1, 261]),
    ("the cat", [1, 265, 280, 294]),
    ("\n", [1, 410, 13]),
    ("ü", [1, 410, 198, 191]),
    ("é", [1, 410, 485]),
    ("Once upon a time", [1, 403, 407, 261, 378]),
]


@pytest.mark.parametrize(("text", "expected"), HAND_CHECKED)
def test_hand_checked_ids(tok, text, expected):
    assert ids(tok, text) == expected
    assert tok.encode(text).tokens[0] == [tok.token(i) for i in expected]


def test_the_pieces_named_in_the_derivations(tok):
    """The hand derivations above read these pieces off the file; check that they are what it says."""
    named = {261: " a", 265: " the", 280: " c", 294: "at", 410: " ", 412: "a", 13: "<0x0A>", 198: "<0xC3>",
             191: "<0xBC>", 485: "é", 403: " Once", 407: " upon", 378: " time", 1: "<s>"}
    assert {i: tok.token(i) for i in named} == named


# --- round trips and agreement with the brute-force reference --------------------------------

ROUND_TRIPS = [
    "", " ", "   ", "a", "Hello world", " leading", "trailing ", "  several   spaces  here  ",
    "Once upon a time, there was a little girl named Lily.", 'She said, "Hi!" (twice); ok? yes: 3-4 $5 & 50%',
    "digits 0123456789 and 3.14159", "line one\nline two\n\n", "\ttab\r\nwindows", "café naïve über ñ",
    "中文字符 你好", "emoji 😀🎉 and 👩‍👩‍👧", "’curly quotes’ — dashes – …", "<unk> <s> </s> <0x41>", "\x00\x7f",
]


@pytest.mark.parametrize("text", ROUND_TRIPS)
def test_round_trip_and_reference(tok, vocabulary, text):
    encoded = ids(tok, text)
    assert encoded[0] == 1
    assert tok.decode(encoded) == text
    assert encoded == reference_encode(text, *vocabulary)
    # The pieces spell the dummy space and the text, byte pieces as their bytes.
    spelled = b"".join(bytes([i - 3]) if 3 <= i < 259 else vocabulary[0][i] for i in encoded[1:])
    assert spelled == (b" " + text.encode("utf-8") if text else b"")


TINY_STORIES_LIKE = st.text(
    alphabet=st.one_of(st.sampled_from(list("abcdehilmnorstuwyTLO .,!\"'\n")), st.characters(exclude_categories=["Cs"])),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(TINY_STORIES_LIKE)
def test_hypothesis_text_matches_the_reference_and_round_trips(tok, vocabulary, text):
    encoded = ids(tok, text)
    assert encoded == reference_encode(text, *vocabulary)
    assert tok.decode(encoded) == text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.text(alphabet="ab c", max_size=30))
def test_random_vocabularies_with_ties_match_the_reference(seed, text):
    """Many pieces over a 4-letter alphabet with scores from a small set: ties everywhere."""
    rng = random.Random(seed)
    pieces = {"".join(rng.choice("ab c") for _ in range(rng.randint(2, 4))) for _ in range(rng.randint(0, 30))}
    extra = [(c, -50.0) for c in "ab "] + [(p, float(rng.choice([-3, -2, -1, 0]))) for p in sorted(pieces - set("ab "))]
    with tempfile.TemporaryDirectory() as folder:
        path = write_tokenizer(Path(folder) / "tok.bin", extra)
        tokenizer = Llama2cTokenizer(path, max_length=1000)
        encoded = ids(tokenizer, text)
        assert encoded == reference_encode(text, *reference_vocabulary(path))
        assert tokenizer.decode(encoded) == text


def test_a_long_text_matches_the_reference(tok, vocabulary):
    text = " ".join(ROUND_TRIPS) * 4
    assert ids(tok, text) == reference_encode(text, *vocabulary)


# --- hand-made files where the merge order matters -------------------------------------------


def test_the_highest_score_merges_first(tmp_path):
    # " a b c" -> both "ab" and "bc" could merge; whichever scores higher takes the "b".
    letters = [(" ", -10.0), ("a", -10.0), ("b", -10.0), ("c", -10.0)]
    sp, a, c = 259, 260, 262  # "b" is 261, "ab" 263, "bc" 264
    bc_wins = Llama2cTokenizer(write_tokenizer(tmp_path / "bc.bin", letters + [("ab", -2.0), ("bc", -1.0)]), 16)
    assert ids(bc_wins, "abc") == [1, sp, a, 264]
    ab_wins = Llama2cTokenizer(write_tokenizer(tmp_path / "ab.bin", letters + [("ab", -1.0), ("bc", -2.0)]), 16)
    assert ids(ab_wins, "abc") == [1, sp, 263, c]
    assert bc_wins.decode([1, sp, a, 264]) == ab_wins.decode([1, sp, 263, c]) == "abc"


def test_ties_go_to_the_leftmost_pair(tmp_path):
    letters = [(" ", -10.0), ("a", -10.0), ("b", -10.0), ("c", -10.0)]
    tied = Llama2cTokenizer(write_tokenizer(tmp_path / "tie.bin", letters + [("ab", -1.0), ("bc", -1.0)]), 16)
    assert ids(tied, "abc") == [1, 259, 263, 262]  # "ab", then "c"
    repeated = Llama2cTokenizer(write_tokenizer(tmp_path / "aa.bin", letters + [("aa", -1.0)]), 16)
    assert ids(repeated, "aaa") == [1, 259, 263, 260]  # "aa" then "a", not "a" then "aa"


def test_a_merge_changes_what_comes_next(tmp_path):
    # "ab" wins first; then "abc" (from "ab" + "c") beats "bc", which no longer exists.
    extra = [(" ", -10.0), ("a", -10.0), ("b", -10.0), ("c", -10.0), ("ab", -1.0), ("bc", -2.0), ("abc", -3.0)]
    tokenizer = Llama2cTokenizer(write_tokenizer(tmp_path / "chain.bin", extra), 16)
    assert ids(tokenizer, "abc") == [1, 259, 265]
    assert ids(tokenizer, "bcab") == [1, 259, 264, 263]


def test_run_c_never_merges_at_or_below_its_starting_score(tmp_path):
    extra = [(" ", -1.0), ("a", -1.0), (" a", -1e10), ("aa", -9.99e9)]
    tokenizer = Llama2cTokenizer(write_tokenizer(tmp_path / "low.bin", extra), 16)
    assert ids(tokenizer, "a") == [1, 259, 260]
    assert ids(tokenizer, "aa") == [1, 259, 262]


def test_text_never_becomes_a_special_or_a_byte_piece(tmp_path):
    # run.c would merge "<un" + "k>" into <unk> (score 0); sentencepiece, and we, only form ordinary pieces.
    extra = [(" ", -1.0), ("<", -1.0), ("u", -1.0), ("n", -1.0), ("k", -1.0), (">", -1.0), ("<un", -1.0), ("k>", -1.0),
             ("un", -1.0)]  # ids 259-267: "un" first, then "<un" and "k>"
    tokenizer = Llama2cTokenizer(write_tokenizer(tmp_path / "specials.bin", extra), 16)
    encoded = ids(tokenizer, "<unk>")
    assert 0 not in encoded and encoded == [1, 259, 265, 266]
    assert tokenizer.decode(encoded) == "<unk>"


def test_without_a_space_piece_the_dummy_prefix_is_the_space_byte(tmp_path):
    tokenizer = Llama2cTokenizer(write_tokenizer(tmp_path / "nospace.bin", [("a", -1.0)]), 16)
    assert ids(tokenizer, "a a") == [1, 0x20 + 3, 259, 0x20 + 3, 259]
    assert tokenizer.decode(ids(tokenizer, "a a")) == " a a"  # a byte piece keeps its space, as in run.c


# --- decoding ---------------------------------------------------------------------------------


def test_decode_follows_run_c(tok):
    assert tok.decode([1, 265, 280, 294]) == "the cat"  # the space after BOS goes
    assert tok.decode([265, 280, 294]) == " the cat"  # a continuation keeps it: it follows its prompt
    assert tok.decode([1, 265, 2, 1, 280]) == "thec"  # specials skipped, but " c" follows a BOS: its space goes
    assert tok.decode([1, 265, 2], skip_special_tokens=False) == "<s>the</s>"
    assert tok.decode([1, 410, 198]) == "\ufffd"  # half of "ü": replaced, not an error
    assert tok.decode([1, 0x20 + 3, 261]) == "  a"  # the byte piece <0x20> is no leading space to strip
    assert tok.decode(torch.tensor([1, 261])) == "a"
    with pytest.raises(ModelError, match="token id 512 is not in the tokenizer"):
        tok.decode([1, 512])


def test_token_readable_and_lookup(tok):
    assert [tok.token(i) for i in (0, 1, 2, 13, 259, 512)] == ["<unk>", "<s>", "</s>", "<0x0A>", " t", "<id 512>"]
    assert tok.readable([1, 265, 13, 198, 2]) == ["<s>", " the", "\n", "<0xC3>", "</s>"]
    assert [tok.token_to_id(t) for t in ("<s>", " the", "<0x0A>", "no such piece")] == [1, 265, 13, None]
    assert tok.special_tokens == frozenset({"<unk>", "<s>", "</s>"})
    assert (tok.bos_id, tok.eos_id, tok.vocab_size, tok.specials_note) == (1, 2, 512, " (<s> included)")


# --- batches, padding and limits ---------------------------------------------------------------


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_batch_is_padded_on_its_side(side):
    tokenizer = Llama2cTokenizer(TOK512, max_length=16, pad_id=0, padding_side=side)
    batch = tokenizer.encode(["a", "the cat", ""])
    rows = [[1, 261], [1, 265, 280, 294], [1]]
    expected_ids, expected_mask = [], []
    for row in rows:
        pad = [0] * (4 - len(row))
        expected_ids.append(pad + row if side == "left" else row + pad)
        expected_mask.append([0] * len(pad) + [1] * len(row) if side == "left" else [1] * len(row) + [0] * len(pad))
    assert batch.input_ids.tolist() == expected_ids
    assert batch.attention_mask.tolist() == expected_mask
    assert batch.tokens == [["<s>", " a"], ["<s>", " the", " c", "at"], ["<s>"]]
    assert batch.lengths == [2, 4, 1]


def test_max_length_counts_bos(tok):
    short = Llama2cTokenizer(TOK512, max_length=4)
    assert ids(short, "the cat") == [1, 265, 280, 294]
    with pytest.raises(SentenceError, match=r"the text has 5 tokens \(<s> included\); .* at most 4 tokens"):
        short.encode("the cats")
    with pytest.raises(SentenceError, match="text 1 has 5 tokens"):
        short.encode(["a", "the cats"])


@pytest.mark.parametrize("bad", [None, 3, ["a", 3], [], "\udc80"])
def test_bad_texts_are_refused(tok, bad):
    with pytest.raises(SentenceError):
        tok.encode(bad)


@pytest.mark.parametrize(("kwargs", "message"), [({"max_length": 0}, "max_length"),
                                                 ({"max_length": 8, "padding_side": "middle"}, "padding_side")])
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(OptionError, match=message):
        Llama2cTokenizer(TOK512, **kwargs)


# --- files that are not a llama2.c tokenizer --------------------------------------------------


def damaged(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "tokenizer.bin"
    path.write_bytes(data)
    return path


def refused(path: Path, **kwargs) -> str:
    with pytest.raises(ModelError) as caught:
        Llama2cTokenizer(path, max_length=16, **kwargs)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message
    return message


def test_a_truncated_file(tmp_path):
    message = refused(damaged(tmp_path, TOK512.read_bytes()[:-3]))
    assert "ends 8 bytes into token 511" in message  # the last entry: 8 bytes of score and length, "~" cut off
    assert "truncated" in refused(damaged(tmp_path, TOK512.read_bytes()[:1000]))


def test_trailing_bytes(tmp_path):
    path = damaged(tmp_path, TOK512.read_bytes() + b"xyz")
    assert "ends 3 bytes into token 512" in refused(path)
    assert "3 stray bytes after its 512 tokens" in refused(path, vocab_size=512)


def test_a_vocabulary_of_another_size(tmp_path):
    message = refused(TOK512, vocab_size=32000)
    assert message == f"the tokenizer {TOK512} has 512 tokens but the checkpoint has 32000: give the tokenizer the model was trained with"
    assert Llama2cTokenizer(TOK512, 16, vocab_size=512).vocab_size == 512


def test_other_broken_files(tmp_path):
    raw = TOK512.read_bytes()
    assert "fewer than its 4-byte header" in refused(damaged(tmp_path, b"\x07\x00"))
    assert "longest token of -1 bytes" in refused(damaged(tmp_path, struct.pack("<i", -1) + raw[4:]))
    negative = raw[:8] + struct.pack("<i", -5) + raw[12:]  # token 0's length
    assert "token 0 has length -5, outside 0..7" in refused(damaged(tmp_path, negative))
    assert "fewer than the 259" in refused(damaged(tmp_path, raw[:4] + struct.pack("<fi", 0.0, 1) + b"a"))
    data = write_tokenizer(tmp_path / "bytes.bin", []).read_bytes().replace(b"<0x00>", b"<0x0G>", 1)
    assert "id 3 should be the byte piece <0x00>" in refused(damaged(tmp_path, data))
    assert "cannot read the tokenizer" in refused(tmp_path / "missing.bin")


def test_a_minimal_file_is_accepted(tmp_path):
    tokenizer = Llama2cTokenizer(write_tokenizer(tmp_path / "bytes.bin", []), 16)
    assert tokenizer.vocab_size == 259
    assert ids(tokenizer, "hi") == [1, 0x20 + 3, ord("h") + 3, ord("i") + 3]
    assert math.isclose(tokenizer.vocabulary.scores[3], 0.0)
