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


from selfattn.analysis.inputs import PROBE_LENGTH
from selfattn.render.text.command_output import command_lines, shown_tokens
from selfattn.render.text.document import Document, Heading, Lines, Note, Paragraph, Table, display_token, fmt
from selfattn.analysis.decoder_roles import (
    DECODER_PATTERNS, DECODER_ROLES, DECODER_THRESHOLD, DUPLICATE_TOKEN, FIRST_TOKEN, INDUCTION, PREVIOUS_TOKEN,
    DecoderHeadRole,
)

TOP_HEADS = 3  # how many strongest heads the summary names
SCORE_KEYS = {PREVIOUS_TOKEN: "previous_token", DUPLICATE_TOKEN: "duplicate_token", INDUCTION: "induction",
              FIRST_TOKEN: "first_token"}  # the JSON's names of the four pattern scores
SCORE_COLUMNS = {PREVIOUS_TOKEN: "prev", DUPLICATE_TOKEN: "dup", INDUCTION: "induct", FIRST_TOKEN: "first"}


def decoder_heads_to_dict(model_name, text, probe, ids, tokens, readable, roles: list[list[DecoderHeadRole]],
                          probe_scores, ablation_delta=None, loss: float | None = None) -> dict:
    """A decoder's heads as plain data, for --format json (and for the text, which reads it).

    Args:
        model_name: the model's name.
        text: the sentence, or None for a probe.
        probe: the Probe, or None for a sentence.
        ids, tokens, readable: the input's token ids, vocabulary strings and decoded texts.
        roles: one list per layer of one DecoderHeadRole per head.
        probe_scores: (layers, heads) induction_probe_score of every head, or None.
        ablation_delta: (layers, heads) the loss change when each head alone is zeroed, or None.
        loss: the mean loss over the scored tokens with every head, or None.

    Returns:
        A dict with the model, the sentence or the probe, the tokens, the threshold, one
        record per head (role, the four scores, entropy in bits averaged over rows 1..,
        ``probe_induction`` on the probe, ``ablation_delta`` with the ablation), the count
        of each role, ``strongest``: for each score, the head with the highest (the first
        of equals), and ``loss`` (null without the ablation).
    """
    heads = []
    for layer, row in enumerate(roles):
        for head, r in enumerate(row):
            record = {"layer": layer, "head": head, "role": r.role,
                      "scores": {SCORE_KEYS[name]: value for name, value in r.scores.items()},
                      "entropy": r.entropy / math.log(2)}  # nats -> bits, as the encoders' table
            if probe_scores is not None:
                record["probe_induction"] = float(probe_scores[layer, head])
            if ablation_delta is not None:
                record["ablation_delta"] = float(ablation_delta[layer, head])
            heads.append(record)
    measures = [*SCORE_KEYS.values()] + (["probe_induction"] if probe_scores is not None else [])
    source = {"sentence": text} if probe is None else {
        "probe": {"kind": probe.kind, "length": probe.length, "seed": probe.seed, "ids": probe.ids}}
    counts = Counter(h["role"] for h in heads)
    return {"model": model_name, **source, "ids": ids, "tokens": tokens, "readable": readable,
            "threshold": DECODER_THRESHOLD, "heads": heads, "roles": {role: counts[role] for role in DECODER_ROLES},
            "strongest": _strongest(heads, measures), "loss": loss}


def decoder_texts_to_dict(model_name: str, texts_file: str, texts: list[str], heads: list[dict], ablation: bool) -> dict:
    """A decoder's heads over a file of texts as plain data: each score's mean and spread.

    Args:
        model_name: the model's name.
        texts_file: the file the texts came from.
        texts: the texts, in order.
        heads: ``head_runs.decoder_over_texts``'s records.
        ablation: whether the records hold ablation_delta.

    Returns:
        A dict with the model, ``texts_file``, ``texts``, the threshold, one record per head
        (role from the mean scores; ``scores`` and ``entropy`` (bits) and ``ablation_delta``
        each {"mean", "std"}), the count of each role and ``strongest`` (by the mean).
    """
    bits = 1 / math.log(2)
    records = []
    for h in heads:
        record = {"layer": h["layer"], "head": h["head"], "role": h["role"],
                  "scores": {SCORE_KEYS[name]: value for name, value in h["scores"].items()},
                  "entropy": {k: v * bits for k, v in h["entropy"].items()}}
        if ablation:
            record["ablation_delta"] = h["ablation_delta"]
        records.append(record)
    counts = Counter(h["role"] for h in records)
    return {"model": model_name, "texts_file": texts_file, "texts": texts, "threshold": DECODER_THRESHOLD,
            "heads": records, "roles": {role: counts[role] for role in DECODER_ROLES},
            "strongest": _strongest(records, list(SCORE_KEYS.values()))}


def _strongest(heads: list[dict], measures: list[str]) -> dict:
    """For each measure, the head with the highest (by the mean over texts), the first of equals."""
    strongest = {}
    for key in measures:
        best = max(heads, key=lambda record: _measure(record, key))  # max keeps the first of equals
        strongest[key] = {"layer": best["layer"], "head": best["head"], "score": _measure(best, key)}
    return strongest


def _measure(record: dict, key: str) -> float:
    """One head record's pattern score ``key``, or its probe_induction (the mean over texts where there are several)."""
    return _mean(record["probe_induction"] if key == "probe_induction" else record["scores"][key])


def _mean(value) -> float:
    """A number, or the mean of a {"mean", "std"} over texts."""
    return value["mean"] if isinstance(value, dict) else value


def _cell(value, precision: int) -> str:
    """A number, or a mean over texts with its spread: "0.41 ± 0.05"."""
    if isinstance(value, dict):
        return f"{fmt(value['mean'], precision)} ± {fmt(value['std'], precision)}"
    return fmt(value, precision)


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
    probe, heads, texts = data.get("probe"), data["heads"], data.get("texts")
    ablation = "ablation_delta" in heads[0]
    doc = Document()
    if texts is not None:
        doc.add(Paragraph(
            f"{len(texts)} texts from {data['texts_file']}, each run on its own: every number below is the mean over "
            "them ± its standard deviation, and the role is read from the means."))
    elif probe is None:
        doc.add(Paragraph(f"Sentence: {display_token(data['sentence'])}"))
    else:
        readable = data["readable"]
        bos = f"the first token {display_token(readable[0])!r}, then " if len(readable) > 2 * probe["length"] else ""
        doc.add(Paragraph(
            f"Probe (induction): {bos}{probe['length']} random tokens (seed {probe['seed']}), then the same "
            f"{probe['length']} again."))
    if texts is None:
        n = len(data["readable"])
        doc.add(Paragraph(f"{n} tokens: {shown_tokens(data['readable'], ' | ')}"))
        perfect = f"(n - 1) / n = {fmt((n - 1) / n, 2)} here"
    else:
        perfect = "(n - 1) / n on a text of n tokens"
    rule = "prev, dup, first and probe" if probe is not None else "prev, dup, induct and first"
    doc.add(
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
            f"Rows with nothing on the pattern still count, so a perfect previous-token head scores {perfect} "
            "(the first token has nothing before it), and dup and induct stay low unless many tokens come back. "
            f"The role is read from the numbers in the table: the highest of {rule}, when it reaches "
            f"{fmt(data['threshold'], 2)}; otherwise the head is mixed."),
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
            "whole probe, first copy included, where nothing repeats yet, so induct stays below one half; that "
            "is why the role reads induction from the probe column."))
        if blind:
            doc.add(Note(
                f"layer(s) {', '.join(map(str, blind))} see only a window of recent tokens, shorter than the "
                f"probe's {probe['length']}: the token after a first copy is out of their reach, so their heads "
                "score 0 on the probe; a --probe-length up to the window fits", True))
    elif texts is None and len(set(data["ids"])) == len(data["ids"]):
        doc.add(Note(
            "no token repeats in this text, so no head can score on dup or induct; give a sentence that says "
            "something twice, or run the probe (below)", True))
    if ablation:
        scored = "the second copy (from its second token)" if probe is not None else "every predicted token"
        before = "" if data.get("loss") is None else f" (with every head: {fmt(data['loss'], precision)} nats)"
        doc.add(Paragraph(
            f"Δ loss is what the head is worth to the model: the mean next-token loss over {scored}{before} with "
            "this head alone set to zero before the output projection, minus the loss with every head. Large and "
            "positive: the model needs the head here; near 0: the others cover for it or it does not matter."))
    columns = ["layer", "head", "role", *SCORE_COLUMNS.values(), "H bits"] + (["probe"] if probe else []) + (
        ["Δ loss"] if ablation else [])
    rows = [
        [str(h["layer"]), str(h["head"]), h["role"], *(_cell(h["scores"][SCORE_KEYS[p]], precision) for p in DECODER_PATTERNS),
         _cell(h["entropy"], precision)] + ([fmt(h["probe_induction"], precision)] if probe else [])
        + ([_cell(h["ablation_delta"], precision)] if ablation else [])
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
    blocks += [Paragraph("Strongest head for each pattern:"), Lines(lines), Paragraph(
        "(pattern score: the share of a head's weight, over every row, on the keys the pattern marks: the token "
        "before, an earlier copy of the same token, the token after an earlier copy, the first token)")]
    model = shlex.quote(model_arg)
    if "ablation_delta" in heads[0]:
        costly = sorted(heads, key=lambda h: (-_mean(h["ablation_delta"]), h["layer"], h["head"]))[:TOP_HEADS]
        blocks.append(Paragraph("Heads the loss needs most (Δ loss when zeroed): " + "; ".join(
            f"layer {h['layer']} head {h['head']} ({_cell(h['ablation_delta'], precision)})" for h in costly) + "."))
        pairs = ",".join(f"{h['layer']}.{h['head']}" for h in costly)
        where = "--probe induction" if probe is not None else "\"TEXT\""
        blocks.append(Paragraph("To knock several out together and see the loss and the next tokens change:"))
        blocks.append(Lines(command_lines("selfattn ablate", f"--model {model} --heads {pairs} {where}")))
    if probe is not None:
        top = sorted(heads, key=lambda h: (-h["probe_induction"], h["layer"], h["head"]))[:TOP_HEADS]
        blocks.append(Paragraph("Top induction heads on the probe: " + "; ".join(
            f"layer {h['layer']} head {h['head']} ({fmt(h['probe_induction'], precision)})" for h in top) + "."))
        blocks.append(Paragraph(
            "(stripe score, the probe column: the mean weight from each token of the second copy to the token after "
            "its first copy; the training summary gives the same score on its run's own probe)"))
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
