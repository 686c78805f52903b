"""The flash variant's own steps: the online softmax block by block, then the checks.

Every number comes from the record's "flash" section, a FlashTrace (the kernel's own
pieces, run on the query's row); nothing here computes attention. The prose is ours.
"""

from __future__ import annotations

from selfattn.render.text.document import Document, Heading, Lines, Note, Paragraph, Table, display_token, fmt, fmt_vector
from selfattn.trace.flash_trace import FlashBlock
from selfattn.trace.record import AttentionTrace


def flash_steps(doc: Document, t: AttentionTrace, p: int, step: int) -> int:
    """The block-by-block step, the comparison with the plain softmax and the lse check; -> the next step number."""
    _blocks(doc, t, p, step)
    _result(doc, t, p, step + 1)
    _lse(doc, t, p, step + 2)
    return step + 3


def _label(t: AttentionTrace, j: int) -> str:
    return display_token(t.tokens[j])


def _score_name(t: AttentionTrace) -> str:
    positional = t.sections["positional"].name
    if positional == "rope":
        return "s = q · k_j (after RoPE)"
    if positional == "alibi":
        return "s = x_q · x_j + ALiBi bias"
    return "s = x_q · x_j"


def _keys(t: AttentionTrace, block: FlashBlock) -> str:
    return ", ".join(_label(t, j) for j in range(block.start, block.end))


def _span(block: FlashBlock) -> str:
    return f"key {block.start}" if block.end - block.start == 1 else f"keys {block.start}-{block.end - 1}"


def _blocks(doc: Document, t: AttentionTrace, p: int, step: int) -> None:
    f, q = t.section("flash"), t.query.index
    n, count = len(t.tokens), len(f.blocks)
    size = f"{f.block_size} key{'s' if f.block_size > 1 else ''}"
    doc.add(
        Heading(f"Step {step} · The online softmax, block by block, for '{_label(t, q)}'"),
        Paragraph(
            "The softmax above needs the whole row of scores at once: first its largest score, then the sum of "
            "all the exponentials, and only then can it divide. Flash attention never holds a whole row. It reads "
            f"the keys a block at a time (here {size} per block, so {n} keys make "
            + (f"{count} blocks, numbered 0 to {count - 1} like the keys" if count > 1 else "a single block, block 0")
            + ") and carries three running numbers for the query from block to block:"
        ),
        Lines(
            [
                "m    the largest score seen so far (it starts at -inf)",
                "l    the sum of exp(s - m) over the keys seen so far (starts at 0)",
                "acc  the sum of exp(s - m) v_j over the same keys (starts at the zero vector)",
            ]
        ),
        Paragraph(
            "A block with a larger score raises m to m'. The terms already in l and acc were measured against the "
            "old m, so both are multiplied by r = exp(m - m'): since exp(s - m) · exp(m - m') = exp(s - m'), every "
            "old term becomes exactly the term it would have been had m' been known from the start. Then the "
            "block's own terms are added:"
        ),
        Lines(
            [
                "m'   = max(m, largest score of the block)",
                "r    = exp(m - m')          (0 for the first block, as exp(-inf) = 0)",
                "l'   = r · l + Σ exp(s_j - m')",
                "acc' = r · acc + Σ exp(s_j - m') v_j",
            ]
        ),
        Note(
            "flash_attention divides the scores by √d by default, like the scaled variant; this walkthrough "
            f"passes scale = {fmt(f.scale, 1)} so the scores are the seed's own and match the steps above."
        ),
    )
    for b, block in enumerate(f.blocks):
        rows = [
            [_label(t, j), fmt(block.scores[q, i], p), fmt(block.exp[q, i], p)]
            for i, j in enumerate(range(block.start, block.end))
        ]
        doc.add(
            Table(
                ["token", _score_name(t), "exp(s - m')"],
                rows,
                title=f"Block {b}{', the last' if b == count - 1 and count > 1 else ''}: {_span(block)} ({_keys(t, block)})",
            ),
            Lines(
                [
                    f"largest score of the block = {fmt(block.block_max[q], p)}",
                    f"m'   = max({fmt(block.m_before[q], p)}, {fmt(block.block_max[q], p)}) = {fmt(block.m_after[q], p)}",
                    f"r    = exp({fmt(block.m_before[q], p)} - {fmt(block.m_after[q], p)}) = {fmt(block.rescale[q], p)}",
                    f"l'   = {fmt(block.rescale[q], p)} · {fmt(block.l_before[q], p)} + {fmt(block.exp_sum[q], p)}"
                    f" = {fmt(block.l_after[q], p)}",
                    f"acc' = {fmt(block.rescale[q], p)} · {fmt_vector(block.acc_before[q].tolist(), p)} + Σ exp(s_j - m') v_j"
                    f" = {fmt_vector(block.acc_after[q].tolist(), p)}",
                ]
            ),
        )
    doc.add(
        Table(
            ["block", "keys", "block max", "m", "r", "l", "acc"],
            [
                [str(b), _keys(t, block), fmt(block.block_max[q], p), fmt(block.m_after[q], p),
                 fmt(block.rescale[q], p), fmt(block.l_after[q], p), fmt_vector(block.acc_after[q].tolist(), p)]
                for b, block in enumerate(f.blocks)
            ],
            title="After each block",
            numeric_from=2,
        )
    )
    if count == 1:
        doc.add(
            Paragraph(
                "With a single block the online softmax is the plain one: m is the row's maximum at once and "
                "nothing needs rescaling. Try --block-size 1 to give every key its own block."
            )
        )
    elif all(float(block.rescale[q]) == 1.0 for block in f.blocks[1:]):
        doc.add(
            Paragraph(
                "In this row the largest score is in the first block, so m never grows after it and every later "
                "r is exactly 1. With --block-size 1, or a query whose largest score comes later, m grows and "
                "r < 1 shrinks the terms already summed."
            )
        )


def _result(doc: Document, t: AttentionTrace, p: int, step: int) -> None:
    f, q = t.section("flash"), t.query.index
    last = f.blocks[-1]
    flash_text, plain_text = fmt_vector(f.output[q].tolist(), p), fmt_vector(f.plain_output[q].tolist(), p)
    width = len(f"flash_attention (block_k = {f.block_size}):")
    query_difference = float((f.output[q] - f.plain_output[q]).abs().max())
    same = (
        f"The two agree to the last digit printed ({p} decimals)."
        if flash_text == plain_text
        else f"At {p} decimals they differ in the last digit, by float rounding only."
    )
    doc.add(
        Heading(f"Step {step} · The result: acc / l is the plain softmax's context vector"),
        Paragraph(
            "After the last block, m is the largest score of the whole row, l is the softmax's denominator "
            "Σ exp(s_j - m) and acc its numerator Σ exp(s_j - m) v_j: the same sums the plain softmax forms, "
            "added up in another order. Dividing once at the end gives the context vector."
        ),
        Lines(
            [
                f"acc / l = {fmt_vector(last.acc_after[q].tolist(), p)} / {fmt(last.l_after[q], p)}"
                f" = {fmt_vector(f.online_output[q].tolist(), p)}",
                f"{f'flash_attention (block_k = {f.block_size}):':<{width}} z = {flash_text}",
                f"{'plain softmax(s) V:':<{width}} z = {plain_text}",
                f"largest difference for '{_label(t, q)}': {query_difference:.1e}; "
                f"over every token: {f.max_difference:.1e}",
            ]
        ),
        Paragraph(
            same + " What is left is floating-point rounding from adding in another order, not an approximation: "
            "flash attention is exact. What it saves is memory: it never holds the n × n scores, only one "
            "block of them and the running numbers."
        ),
    )


def _lse(doc: Document, t: AttentionTrace, p: int, step: int) -> None:
    s, f, q = t.steps, t.section("flash"), t.query.index
    last = f.blocks[-1]
    columns = [_score_name(t), "exp(s - lse)", "softmax α"]
    rows = [
        [_label(t, j), fmt(s.masked[0, q, j], p), fmt(f.weights_from_lse[q, j], p), fmt(f.plain_weights[q, j], p)]
        for j in range(len(t.tokens))
    ]
    doc.add(
        Heading(f"Step {step} · The weights again, from the log-sum-exp"),
        Paragraph(
            "Flash attention hands back one more number per query: lse = m + log l, the log of the softmax's "
            "denominator. With it any single weight can be rebuilt later without summing the row again, "
            "α_j = exp(s_j - lse), which is how the backward pass and attention_probs_from_lse get the weights "
            "they need."
        ),
        Lines([f"lse = m + log l = {fmt(last.m_after[q], p)} + log {fmt(last.l_after[q], p)} = {fmt(f.lse[q], p)}"]),
        Table(["token"] + columns, rows, highlight_row=q),
        Lines(
            [
                f"largest difference between exp(s - lse) and the softmax, over every token: {f.weights_max_difference:.1e}"
            ]
        ),
    )
