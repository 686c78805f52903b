"""`selfattn heads` on an encoder: every head's role as JSON, or as a table with its explanation.

``commands.heads`` runs the model and classifies every layer's every head with
``analysis.head_roles`` (previous, next, self, [CLS]/[SEP], one token, spread); this
module lays the roles out, as text, markdown or JSON through the project's document
model. A decoder's heads are laid out by ``decoder_heads``; what the commands' outputs
share (checks, JSON and document writers) is in ``command_output``.
"""

from __future__ import annotations

import math
import shlex
from collections import Counter


from selfattn.render.text.command_output import command_lines, shown_tokens
from selfattn.render.text.document import Document, Heading, Lines, Note, Paragraph, Table, display_token, fmt
from selfattn.analysis.head_roles import PARTS, ROLE_THRESHOLD, ROLES, SPREAD, HeadRole

SHOWN_TARGET = 8  # a longer "one token" word is cut, so the role column stays 16 wide
TOP_HEADS = 3  # how many most focused / most spread heads the summary names
PART_COLUMNS = {"previous token": "prev", "next token": "next", "self": "self", "[CLS]/[SEP]": "[CLS]/[SEP]",
                "other": "other"}


def heads_to_dict(model_name: str, sentence: str, tokens: list[str], roles: list[list[HeadRole]]) -> dict:
    """Every head's role and measures as plain data, for --format json.

    Args:
        model_name: the model's name.
        sentence: the text the model read.
        tokens: its tokens.
        roles: one list per layer of one HeadRole per head.

    Returns:
        A dict with the model, sentence, tokens, threshold, one record per head and the
        count of each role. ``target_token`` and ``target_index`` name the word a "one
        token" head looks at (null for other roles); ``focus`` is the word the other words
        look at most, for every head, with their mean weight on it.
    """
    heads = []
    for layer, row in enumerate(roles):
        for head, r in enumerate(row):
            target = r.target
            heads.append({
                "layer": layer, "head": head, "role": r.role, "share": r.share,
                "target_token": target.token if target else None, "target_index": target.index if target else None,
                "entropy": r.entropy, "normalized_entropy": r.normalized_entropy, "shares": dict(r.shares),
                "focus": {"index": r.focus.index, "token": r.focus.token, "share": r.focus.share} if r.focus else None,
            })
    counts = Counter(h["role"] for h in heads)
    return {"model": model_name, "sentence": sentence, "tokens": tokens, "threshold": ROLE_THRESHOLD,
            "heads": heads, "roles": {role: counts[role] for role in ROLES}}


def heads_document(
    model_name: str, sentence: str, tokens: list[str], roles: list[list[HeadRole]], precision: int, is_seed: bool
) -> Document:
    """The heads table with its explanation and summary, as a Document.

    Args:
        model_name: the model's name.
        sentence: the text the model read.
        tokens: its tokens.
        roles: one list per layer of one HeadRole per head.
        precision: decimals for the numbers.
        is_seed: whether the sentence is the seed's (the suggested command then needs no sentence).

    Returns:
        The Document to render as text or markdown.
    """
    n = len(tokens)
    heads = [(layer, head, r) for layer, row in enumerate(roles) for head, r in enumerate(row)]
    t = f"{ROLE_THRESHOLD:.0%}"
    doc = Document()
    doc.add(
        Paragraph(f"Sentence: {display_token(sentence)}"),
        Paragraph(f"{n} WordPiece tokens: {shown_tokens(tokens, ' ')}"),
        Heading("How to read the table"),
        Paragraph(
            "Each head gives every token a row of weights over all the tokens, adding up to 100%. We read "
            "the rows of the words (not [CLS] and [SEP]) and split each one into five parts that do not "
            "overlap: the weight on the word just before (prev), on the word just after (next), on the word "
            "itself (self), on [CLS] and [SEP] together, and on every other word (other). Each column is "
            "its part averaged over the same words, so every row of the table adds up to 100%. Before the "
            "first word comes [CLS] and after the last comes [SEP]: that weight counts under [CLS]/[SEP], "
            "so the first word adds 0 to prev and the last adds 0 to next."
        ),
        Paragraph(
            f"A head's role is the largest of prev, next, self and [CLS]/[SEP] when it holds at least {t}. "
            f"Failing that, the role is → W (one token: W) when the other words (all but W itself) put "
            f"on average at least {t} of their weight on the same word W; its share is that average, and it "
            "overlaps the parts (for the word just before W, its weight on W is next). Otherwise the weight "
            "is shared out and the role is spread."
        ),
        Paragraph("Entropy (H bits) says how spread a row is, in bits, averaged over the words:"),
        Lines([
            f"{'H = -sum_j a_j log2 a_j':33}(0 log2 0 counts as 0)",
            f"{'H = 0 bits':33}one token takes all the weight",
            f"{f'H = log2 n = {fmt(math.log2(n), 2)} bits':33}each of the n = {n} tokens gets the same weight",
        ]),
        Paragraph(
            "H / log2 n (H/log2n) puts this on a scale from 0 (focused) to 1 (uniform). Layers, heads and token "
            "positions count from 0, as --layer and --head of selfattn explain --model."
        ),
    )
    if n <= 2:
        doc.add(Note("the text has no word tokens, only [CLS] and [SEP]: the heads can only look at those", True))
    columns = ["layer", "head", "role", *PART_COLUMNS.values(), "H bits", "H/log2n"]  # short: 100 columns at 4 digits
    rows = [
        [str(layer), str(head), role_label(r, tokens), *(percent(r.shares[p], precision) for p in PARTS),
         fmt(r.entropy, precision), fmt(r.normalized_entropy, precision)]
        for layer, head, r in heads
    ]
    doc.add(Table(columns, rows, numeric_from=3))
    doc.add(Note("prev + next + self + [CLS]/[SEP] + other = 100% on every row, up to rounding."))
    doc.add(Heading("Summary"), *heads_summary(model_name, sentence, heads, precision, is_seed))
    doc.add(Note(
        "many heads of BERT-like encoders put their weight on [CLS] and [SEP] when they find nothing to do "
        "in a sentence, so a [CLS]/[SEP] role often means the head is idle on this input."
    ))
    return doc


def role_label(role: HeadRole, tokens: list[str]) -> str:
    """A head's role as the table shows it; "→ cat" is "one token" with its word (and position if repeated).

    Args:
        role: the head's HeadRole.
        tokens: the tokens, to tell whether the word occurs more than once.

    Returns:
        The role's name, with the word for "one token".
    """
    target = role.target
    if target is None:
        return role.role
    word = display_token(target.token)
    word = word if len(word) <= SHOWN_TARGET else word[: SHOWN_TARGET - 1] + "…"
    repeated = tokens.count(target.token) > 1
    return f"→ {word}" + (f" ({target.index})" if repeated else "")


def heads_summary(model_name, sentence, heads, precision, is_seed) -> list[Paragraph | Lines]:
    """The summary under the table: role counts, the most focused and most spread heads, a command.

    Args:
        model_name: the model's name.
        sentence: the text the model read.
        heads: (layer, head, HeadRole) for every head.
        precision: decimals for the numbers.
        is_seed: whether the sentence is the seed's (the command then needs no sentence).

    Returns:
        The summary's blocks.
    """
    counts = Counter(r.role for _, _, r in heads)
    by_entropy = sorted(heads, key=lambda item: (item[2].normalized_entropy, item[0], item[1]))

    def named(items) -> str:
        return "; ".join(
            f"layer {layer} head {head} ({fmt(r.entropy, precision)} bits, {role_label(r, [])}"
            + (f" {percent(r.share, precision)})" if r.role != SPREAD else ")")
            for layer, head, r in items
        )

    layer, head, _ = by_entropy[0]
    quoted = "" if is_seed else " " + shlex.quote(sentence if len(sentence) <= 90 else "YOUR SENTENCE")
    blocks: list[Paragraph | Lines] = [
        Paragraph("Roles: " + ", ".join(f"{counts[role]} {role}" for role in ROLES) + f" (of {len(heads)} heads)."),
    ]
    single = [(layer_, head_, r) for layer_, head_, r in heads if r.target is not None]
    if single:
        blocks.append(Paragraph("Looking at one token: " + "; ".join(
            f"layer {l} head {h} at {display_token(r.target.token)!r} (position {r.target.index}, "
            f"{percent(r.share, precision)})" for l, h, r in single) + "."))
    blocks += [
        Paragraph(f"Most focused: {named(by_entropy[:TOP_HEADS])}."),
        Paragraph(f"Most spread out: {named(by_entropy[::-1][:TOP_HEADS])}."),
        Paragraph("To walk through the most focused head step by step:"),
        Lines(command_lines(f"selfattn explain{quoted}", f"--model {model_name} --layer {layer} --head {head}")),
    ]
    return blocks


def percent(share: float, precision: int) -> str:
    """A share in percent, as fine as the share itself at ``precision`` decimals (0.1234 at 4 -> 12.34%)."""
    return fmt(100 * share, max(precision - 2, 0)) + "%"


# ---------------------------------------------------------------- decoders


def encoder_texts_to_dict(model_name: str, texts_file: str, texts: list[str], heads: list[dict]) -> dict:
    """An encoder's heads over a file of texts as plain data: each share's mean and spread.

    Args:
        model_name: the model's name.
        texts_file: the file the texts came from.
        texts: the texts, in order.
        heads: ``head_runs.encoder_over_texts``'s records (role and share from the means;
            shares, focus_share and entropy each {"mean", "std"}).

    Returns:
        A dict with the model, ``texts_file``, ``texts``, the threshold, the head records and
            the count of each role.
    """
    counts = Counter(h["role"] for h in heads)
    return {"model": model_name, "texts_file": texts_file, "texts": texts, "threshold": ROLE_THRESHOLD,
            "heads": heads, "roles": {role: counts[role] for role in ROLES}}


def encoder_texts_document(data: dict, precision: int) -> Document:
    """An encoder's heads over several texts: each part's mean share ± its spread, and the role of the means."""
    t = f"{ROLE_THRESHOLD:.0%}"
    doc = Document()
    doc.add(
        Paragraph(f"{len(data['texts'])} texts from {data['texts_file']}, each run on its own: every number below is "
                  "the mean over them ± its standard deviation."),
        Heading("How to read the table"),
        Paragraph(
            "For each text, each head's rows of the words (not [CLS] and [SEP]) are split into five parts: the "
            "weight on the word just before (prev), just after (next), on itself (self), on [CLS] and [SEP], and "
            f"on every other word (other). The role is read from the means: the largest of prev, next, self and "
            f"[CLS]/[SEP] when it holds at least {t}; else one token when the other words put at least {t} on one "
            "word (focus, which may be a different word in each text); else spread. H bits is the mean row "
            "entropy. Layers and heads count from 0."),
    )

    def cell(value: dict, as_percent: bool) -> str:
        show = (lambda v: percent(v, precision)) if as_percent else (lambda v: fmt(v, precision))
        return f"{show(value['mean'])} ± {show(value['std'])}"

    columns = ["layer", "head", "role", *PART_COLUMNS.values(), "focus", "H bits"]
    rows = [[str(h["layer"]), str(h["head"]), h["role"], *(cell(h["shares"][p], True) for p in PARTS),
             cell(h["focus_share"], True), cell(h["entropy"], False)] for h in data["heads"]]
    doc.add(Table(columns, rows, numeric_from=3))
    counts = data["roles"]
    doc.add(Heading("Summary"), Paragraph(
        "Roles: " + ", ".join(f"{counts[role]} {role}" for role in ROLES) + f" (of {len(data['heads'])} heads)."))
    return doc
