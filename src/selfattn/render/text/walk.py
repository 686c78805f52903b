"""One walkthrough for every record: each section writes its steps, in reading order.

``walkthrough(record)`` goes down ``STEPS`` and lets every entry whose section the
record holds write its part of the document, numbering the steps as it goes:

    inputs       the tokens and the embeddings (the seed's with the maths' numbering x^(i),
                 a variant's after a line on what it adds)
    seed         the seed's walk of its query: scores term by term, softmax, context, all at once
    positional   a table added to X (sinusoidal, learned), before the projections
    projections  Q, K and V from the seeded projections
    positional   RoPE or ALiBi, which act on q, k and the scores, after them
    mask         the causal mask
    variant      each head: its scores, scaling, softmax and output
    flash        the keys folded in block by block
    variant      the output: the heads side by side and W_o
    model        a model's layer and head, from its tokens to where the head's output goes

The sections' own writers live beside their kind (``walkthrough`` for the seed,
``variant_walkthrough`` and ``flash_walkthrough`` for the variants, ``model_walkthrough``
with ``model_input`` for a model); nothing here asks which kind a record is.
"""

from __future__ import annotations

from typing import Callable

from selfattn.render.text.document import Document, Paragraph
from selfattn.render.text.flash_walkthrough import flash_steps
from selfattn.render.text.variant_walkthrough import INTRO, head_step, mask_step, output_step, positional_step, projections_step
from selfattn.render.text.seed_walkthrough import embeddings_step, seed_steps, tokens_step
from selfattn.formatting import check_precision
from selfattn.trace.record import AttentionTrace, record_of

# (doc, record, precision, the next step's number) -> the number after the steps written
Writer = Callable[[Document, AttentionTrace, int, int], int]


def _inputs(doc: Document, record: AttentionTrace, p: int, step: int) -> int:
    inputs, q = record.sections["inputs"], record.query.index
    maths = record.section("seed") is not None  # the seed's walk numbers its tokens as the formulas do, too
    if not maths:
        doc.add(Paragraph(f"Variant '{inputs.variant}': {INTRO[inputs.variant]}."))
    tokens_step(doc, record.tokens, q, math_notation=maths)
    embeddings_step(doc, record.tokens, record.embeddings, inputs.source, q, p, math_notation=maths)
    return 3


def _seed(doc: Document, record: AttentionTrace, p: int, step: int) -> int:
    seed_steps(doc, record, p)
    return step


def _positional(tables: bool) -> Writer:
    """The positional step where it belongs: a table added to X (``tables``) before the projections,
    RoPE and ALiBi, which act on q, k and the scores, after them."""

    def write(doc: Document, record: AttentionTrace, p: int, step: int) -> int:
        positional = record.sections["positional"]
        if positional.name == "none" or (positional.encoding is not None) != tables:
            return step
        positional_step(doc, record, p, step)
        return step + 1

    return write


def _projections(doc: Document, record: AttentionTrace, p: int, step: int) -> int:
    projections_step(doc, record, p, step)
    return step + 1


def _mask(doc: Document, record: AttentionTrace, p: int, step: int) -> int:
    mask_step(doc, record, p, step)
    return step + 1


def _heads(doc: Document, record: AttentionTrace, p: int, step: int) -> int:
    for h in range(record.steps.n_heads):
        head_step(doc, record, p, step, h)
    return step + 1


def _flash(doc: Document, record: AttentionTrace, p: int, step: int) -> int:
    return flash_steps(doc, record, p, step)


def _output(doc: Document, record: AttentionTrace, p: int, step: int) -> int:
    output_step(doc, record, p, step)
    return step + 1


def _model(doc: Document, record: AttentionTrace, p: int, step: int) -> int:
    # A model's writers are imported with the first model's record: the seed's start-up skips them.
    from selfattn.render.text.model_walkthrough import model_steps

    model_steps(doc, record, p)
    return step


STEPS: list[tuple[str, Writer]] = [
    ("inputs", _inputs),
    ("seed", _seed),
    ("positional", _positional(tables=True)),
    ("projections", _projections),
    ("positional", _positional(tables=False)),
    ("mask", _mask),
    ("variant", _heads),
    ("flash", _flash),
    ("variant", _output),
    ("model", _model),
]
"""The reading order: (section, its writer); a writer runs when the record holds its section."""


def walkthrough(trace: AttentionTrace, precision: int = 4) -> Document:
    """Every step of the record, in reading order, as one Document.

    Args:
        trace: an ``AttentionTrace`` (what ``build_trace`` and the trace functions return).
        precision: decimals shown, 0 to 10.

    Returns:
        The Document that ``explain.text`` and ``explain.markdown`` lay out.

    Raises:
        OptionError: the precision is out of range.
    """
    check_precision(precision)
    record = record_of(trace)
    doc = Document()
    step = 1
    for name, write in STEPS:
        if name in record.sections:
            step = write(doc, record, precision, step)
    return doc
