"""``selfattn heads`` on a decoder: four pattern scores per head, on a sentence or the induction probe.

Each head gets TransformerLens's "mul" score for four patterns (previous token, duplicate
token, induction, first token): the share of the head's attention that falls on the
pattern. ``--probe induction`` replaces the sentence by random tokens repeated twice, where
an induction head looks from each token of the second copy to the token after its first
occurrence. ``model_commands.heads_command`` sends decoders here.
"""

from __future__ import annotations

import math
import shlex
from collections import Counter


from selfattn.analysis.probes import PROBE_LENGTH
from selfattn.explain.command_output import command_lines, shown_tokens
from selfattn.explain.document import Document, Heading, Lines, Note, Paragraph, Table, display_token, fmt
from selfattn.analysis.decoder_roles import (
    DECODER_PATTERNS, DECODER_ROLES, DECODER_THRESHOLD, DUPLICATE_TOKEN, FIRST_TOKEN, INDUCTION, PREVIOUS_TOKEN,
    DecoderHeadRole,
)

TOP_HEADS = 3  # how many strongest heads the summary names
SCORE_KEYS = {PREVIOUS_TOKEN: "previous_token", DUPLICATE_TOKEN: "duplicate_token", INDUCTION: "induction",
              FIRST_TOKEN: "first_token"}  # the JSON's names of the four pattern scores
SCORE_COLUMNS = {PREVIOUS_TOKEN: "prev", DUPLICATE_TOKEN: "dup", INDUCTION: "induct", FIRST_TOKEN: "first"}


def decoder_heads_to_dict(model_name, text, probe, ids, tokens, readable, roles: list[list[DecoderHeadRole]],
                          probe_scores) -> dict:
    """A decoder's heads as plain data, for --format json (and for the text, which reads it).

    Args:
        model_name: the model's name.
        text: the sentence, or None for a probe.
        probe: the Probe, or None for a sentence.
        ids, tokens, readable: the input's token ids, vocabulary strings and decoded texts.
        roles: one list per layer of one DecoderHeadRole per head.
        probe_scores: (layers, heads) induction_probe_score of every head, or None.

    Returns:
        A dict with the model, the sentence or the probe, the tokens, the threshold, one
        record per head (role, the four scores, entropy in bits averaged over rows 1..,
        and ``probe_induction`` on the probe), the count of each role, and ``strongest``:
        for each score, the head with the highest (the first of equals).
    """
    heads = []
    for layer, row in enumerate(roles):
        for head, r in enumerate(row):
            record = {"layer": layer, "head": head, "role": r.role,
                      "scores": {SCORE_KEYS[name]: value for name, value in r.scores.items()},
                      "entropy": r.entropy / math.log(2)}  # nats -> bits, as the encoders' table
            if probe_scores is not None:
                record["probe_induction"] = float(probe_scores[layer, head])
            heads.append(record)
    measures = [*SCORE_KEYS.values()] + (["probe_induction"] if probe_scores is not None else [])
    strongest = {}
    for key in measures:
        best = max(heads, key=lambda record: _measure(record, key))  # max keeps the first of equals
        strongest[key] = {"layer": best["layer"], "head": best["head"], "score": _measure(best, key)}
    source = {"sentence": text} if probe is None else {
        "probe": {"kind": probe.kind, "length": probe.length, "seed": probe.seed, "ids": probe.ids}}
    counts = Counter(h["role"] for h in heads)
    return {"model": model_name, **source, "ids": ids, "tokens": tokens, "readable": readable,
            "threshold": DECODER_THRESHOLD, "heads": heads, "roles": {role: counts[role] for role in DECODER_ROLES},
            "strongest": strongest}


def _measure(record: dict, key: str) -> float:
    """One head record's pattern score ``key``, or its probe_induction."""
    return record["probe_induction"] if key == "probe_induction" else record["scores"][key]


def decoder_heads_document(data: dict, precision: int, model_arg: str, blind: list[int] = ()) -> Document:
    """A decoder's heads table with its explanation and summary, as a Document.

    Args:
        data: what ``decoder_heads_to_dict`` returns.
        precision: decimals for the numbers.
        model_arg: the model as the user named it, for the suggested commands.
        blind: the layers whose sliding window is shorter than one copy of the probe.

    Returns:
        The Document to render as text or markdown.
    """
    readable, probe, heads = data["readable"], data.get("probe"), data["heads"]
    n = len(readable)
    doc = Document()
    if probe is None:
        doc.add(Paragraph(f"Sentence: {display_token(data['sentence'])}"))
    else:
        bos = f"the first token {display_token(readable[0])!r}, then " if n > 2 * probe["length"] else ""
        doc.add(Paragraph(
            f"Probe (induction): {bos}{probe['length']} random tokens (seed {probe['seed']}), then the same "
            f"{probe['length']} again."))
    doc.add(
        Paragraph(f"{n} tokens: {shown_tokens(readable, ' | ')}"),
        Heading("How to read the table"),
        Paragraph(
            "In a decoder each token gives a row of weights, adding up to 1, to itself and the tokens before "
            "it, never to those after. Each score says how much of a head's weight follows one pattern:"),
        Lines([
            "prev    previous token    the token just before",
            "dup     duplicate token   an earlier copy of the same token",
            "induct  induction         the token just after an earlier copy of the same token: having read",
            "                          'A B ... A', the head looks back at B, the word to say next",
            "first   first token       the very first token, where many heads park weight they do not need",
        ]),
        Paragraph(
            "A score is the weight that falls on the pattern, summed over every row, divided by all the weight "
            "of those rows: sum(a × P) / sum(a), TransformerLens's detect_head \"mul\" score, from 0 to 1. "
            "Rows with nothing on the pattern still count, so a perfect previous-token head scores (n - 1) / n "
            f"= {fmt((n - 1) / n, 2)} here (the first token has nothing before it), and dup and induct stay low unless many tokens come back. "
            f"The role is the pattern with the highest score when it reaches {fmt(data['threshold'], 2)}; "
            "otherwise the head is mixed."),
        Paragraph(
            "H bits is how spread out a row is, -sum_j a_j log2 a_j, averaged over the rows after the first "
            "(which can only look at itself): 0 bits when one token takes all the weight, up to log2(i + 1) "
            "when row i spreads it evenly. Layers, heads and token positions count from 0."),
    )
    if probe is not None:
        doc.add(Paragraph(
            "In the second copy every token was seen once before, so an induction head looks from it to the "
            "token that followed its first copy. probe is that weight averaged over the second copy: 1 for a "
            "perfect induction head, near 0 for a head that does something else. The pattern scores read the "
            "whole probe, first copy included, where nothing repeats yet, so induct stays below one half."))
        if blind:
            doc.add(Note(
                f"layer(s) {', '.join(map(str, blind))} see only a window of recent tokens, shorter than the "
                f"probe's {probe['length']}: the token after a first copy is out of their reach, so their heads "
                "score 0 on the probe; a --probe-length up to the window fits", True))
    elif len(set(data["ids"])) == len(data["ids"]):
        doc.add(Note(
            "no token repeats in this text, so no head can score on dup or induct; give a sentence that says "
            "something twice, or run the probe (below)", True))
    columns = ["layer", "head", "role", *SCORE_COLUMNS.values(), "H bits"] + (["probe"] if probe else [])
    rows = [
        [str(h["layer"]), str(h["head"]), h["role"], *(fmt(h["scores"][SCORE_KEYS[p]], precision) for p in DECODER_PATTERNS),
         fmt(h["entropy"], precision)] + ([fmt(h["probe_induction"], precision)] if probe else [])
        for h in heads
    ]
    doc.add(Table(columns, rows, numeric_from=3))
    doc.add(Heading("Summary"), *decoder_heads_summary(data, precision, model_arg))
    return doc


def decoder_heads_summary(data: dict, precision: int, model_arg: str) -> list[Paragraph | Lines]:
    """Role counts, the strongest head of each pattern, the top probe heads and what to run next."""
    heads, probe, strongest = data["heads"], data.get("probe"), data["strongest"]
    counts = data["roles"]
    blocks: list[Paragraph | Lines] = [
        Paragraph("Roles: " + ", ".join(f"{counts[role]} {role}" for role in DECODER_ROLES) + f" (of {len(heads)} heads)."),
    ]
    lines = []
    for pattern in DECODER_PATTERNS:
        best = strongest[SCORE_KEYS[pattern]]
        where = f"layer {best['layer']} head {best['head']} ({fmt(best['score'], precision)})" if best["score"] > 0 else (
            "none: no head puts weight there")
        lines.append(f"{pattern + ':':17}{where}")
    blocks += [Paragraph("Strongest head for each pattern:"), Lines(lines)]
    model = shlex.quote(model_arg)
    if probe is not None:
        top = sorted(heads, key=lambda h: (-h["probe_induction"], h["layer"], h["head"]))[:TOP_HEADS]
        blocks.append(Paragraph("Top induction heads on the probe: " + "; ".join(
            f"layer {h['layer']} head {h['head']} ({fmt(h['probe_induction'], precision)})" for h in top) + "."))
        blocks.append(Paragraph(
            "A trained model usually has a few heads near 1 in its middle layers; in a random or tiny model "
            "every head stays low. Another seed gives other random tokens:"))
        length = "" if probe["length"] == PROBE_LENGTH else f" --probe-length {probe['length']}"
        blocks.append(Lines(command_lines("selfattn heads", f"--model {model} --probe induction{length} --seed {probe['seed'] + 1}")))
        return blocks
    blocks.append(Paragraph(
        "Duplicate-token and induction heads show only where tokens repeat. To test every head for induction "
        "on random tokens repeated twice:"))
    blocks.append(Lines(command_lines("selfattn heads", f"--model {model} --probe induction")))
    return blocks
