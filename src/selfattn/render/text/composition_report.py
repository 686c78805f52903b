"""``selfattn heads --composition`` written out: the strongest pairs of each kind, and JSON of every score."""

from __future__ import annotations

import math

from selfattn.render.text.document import Document, Heading, Paragraph, Table, fmt

STRONGEST = 10  # pairs listed for each kind
KINDS = {"q": ("Q-composition", "queries"), "k": ("K-composition", "keys"), "v": ("V-composition", "values")}


def composition_to_dict(model_name: str, found) -> dict:
    """The scores as plain data.

    Returns:
        model; composition {"q", "k", "v"}: n_layers x n_heads x n_layers x n_heads nested
        lists ([l1][h1][l2][h2]: how much head l2.h2 reads head l1.h1's output; null unless
        l1 < l2); baseline {"q", "k", "v"}; strongest {"q", "k", "v"}: the highest pairs,
        [{writer [l, h], reader [l, h], score, above_baseline}].
    """
    def plain(tensor):
        return [[[[None if math.isnan(v) else v for v in row] for row in block] for block in layer]
                for layer in tensor.tolist()]

    return {
        "model": model_name,
        "composition": {mode: plain(getattr(found, mode)) for mode in KINDS},
        "baseline": dict(found.baseline),
        "strongest": {mode: [{"writer": [l1, h1], "reader": [l2, h2], "score": score,
                              "above_baseline": score - found.baseline[mode]}
                             for l1, h1, l2, h2, score in found.strongest(mode, STRONGEST)] for mode in KINDS},
    }


def composition_document(data: dict, precision: int) -> Document:
    """Each kind's strongest pairs, with how to read the scores."""
    doc = Document()
    doc.add(
        Heading("How to read it"),
        Paragraph(
            "A head writes into the residual stream through its OV circuit (W_V W_O) and reads it through its QK "
            "circuit (W_Q W_K^T, queries against keys) and its values. A later head can read an earlier head's "
            "output in its queries (Q-composition), its keys (K-composition: an induction head finds the token "
            "after an earlier copy through keys a previous-token head wrote) or its values (V-composition). The "
            "score is the size of the product of the two circuits against the product of their sizes "
            "(Frobenius norms), from the weights alone; the baseline is the same score for random matrices of "
            "these shapes. Heads are written LAYER.HEAD, from 0."),
    )
    for mode, (title, what) in KINDS.items():
        baseline = data["baseline"][mode]
        doc.add(
            Heading(f"{title}: later heads' {what} reading earlier heads (baseline {fmt(baseline, precision)})"),
            Table(["writer -> reader", "score", "above baseline"],
                  [[f"{p['writer'][0]}.{p['writer'][1]} -> {p['reader'][0]}.{p['reader'][1]}", fmt(p["score"], precision),
                    fmt(p["above_baseline"], precision)] for p in data["strongest"][mode]], numeric_from=1),
        )
    return doc
