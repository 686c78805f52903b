"""The commands that show one sentence's attention: explain, plot, view and compare (their flags and runs)."""

from __future__ import annotations

import argparse
import sys

from selfattn.cli.options import (
    COMPARE_EXAMPLES,
    COMPARE_QUERY_HELP,
    EXPLAIN_EXAMPLES,
    PLOT_EXAMPLES,
    VIEW_EXAMPLES,
    add_input_options,
    add_output_options,
    add_view_options,
)
from selfattn.render.visual import PLOT_KINDS


def add_explain_command(commands) -> None:
    """``selfattn explain``: the seed's walkthrough, a variant's or a model's head, step by step."""
    explain = commands.add_parser(
        "explain",
        help="walk through self-attention step by step",
        description=(
            "Walk through self-attention on a sentence: tokens, embeddings, dot-product scores, "
            "softmax and context vectors, with every number. With no sentence it runs the seed's "
            "example, 'The cat sat on the warm mat', with its hand-made 3-dimensional embeddings."
        ),
    )
    explain.epilog = EXPLAIN_EXAMPLES
    add_input_options(explain)
    add_view_options(explain, default=None, needs="needs --model")
    add_output_options(explain, 4)
    explain.set_defaults(run=run_explain)


def add_plot_command(commands) -> None:
    """``selfattn plot``: a sentence's attention (or a mask's block map, a training run) as a picture."""
    plot = commands.add_parser(
        "plot",
        help="draw attention as a picture (PNG or SVG)",
        description="Draw the attention of a sentence as a PNG or SVG picture. Same inputs as explain.",
    )
    plot.epilog = PLOT_EXAMPLES
    add_input_options(plot)
    plot.add_argument("--kind", required=True, choices=PLOT_KINDS, metavar="KIND", help=f"what to draw: {' | '.join(PLOT_KINDS)}")
    plot.add_argument("-o", "--output", required=True, metavar="FILE", help="the picture: .png or .svg")
    add_view_options(plot)
    plot.add_argument(
        "--mask",
        metavar="SPEC",
        help="for --kind mask: causal | causal-bottom-right[:P] (P cached keys before the sentence, default 3) | "
        "sliding-window[:W] (window of W tokens, default 3) | padding[:L] (the first L tokens are real, "
        "default all but 2) | documents[:A,B,...] (packed documents, default two halves; AxK is K documents "
        "of A tokens) | prefix-lm[:P] (the first P tokens see each other both ways, causal after; default half) | "
        "none. Default: the variant's own mask",
    )
    plot.add_argument("--tile", type=int, metavar="N",
                      help="for --kind mask: tiles of N x N in the block map (skipped / full / partial), default 2 (for more than "
                      "64 tokens the power of two that keeps the map to 32 tiles a side); "
                      "with --length, the block size of the map, default 128")
    plot.add_argument("--length", type=int, metavar="LEN",
                      help="for --kind mask: draw the block map of --mask or --mask-mod over LEN positions (1 to "
                      "1048576) instead of the sentence's mask: one cell per block of --tile x --tile, empty "
                      "(skipped), full (no mask) or partial (masked per element)")
    plot.add_argument("--mask-mod", metavar="FILE.py:NAME",
                      help="with --length: the block map of your own mask_mod(b, h, q_idx, kv_idx) -> bool tensor, "
                      "the function NAME of the Python file FILE.py (swept over every pair, B and H None; "
                      "--length at most 65536)")
    plot.add_argument("--training", metavar="DIR",
                      help="with --kind training (and only with it): a training run's folder (selfattn train --out); "
                      "draws its losses and every head's induction score over the steps. The sentence, embedding, "
                      "variant and model options, --query, --layer, --head, --mask, --tile, --length and "
                      "--mask-mod are refused with it")
    plot.add_argument("--fixed-scale", action="store_true",
                      help="with --kind heatmap: colours on the fixed 0-1 scale instead of this map's own range")
    plot.set_defaults(run=run_plot)


def add_view_command(commands) -> None:
    """``selfattn view``: the explorer page of a sentence's attention or of a training run."""
    view = commands.add_parser(
        "view",
        help="write an interactive explorer as one self-contained HTML file",
        description=(
            "Write one self-contained HTML page (no network, no external scripts) to explore the attention "
            "of a sentence: hover or click a token to see where it looks, with every number of the steps."
        ),
    )
    view.epilog = VIEW_EXAMPLES
    add_input_options(view)
    view.add_argument("-o", "--output", required=True, metavar="FILE", help="the page: .html")
    add_view_options(view)
    view.add_argument("--precision", type=int, default=4, metavar="DIGITS", help="decimals shown, 0 to 10 (default 4)")
    view.add_argument("--training", metavar="DIR",
                      help="a training run's folder (selfattn train --out): a page with a step slider that replays "
                      "the probe's attention, every head's scores and the loss curve. --layer and --head pick the "
                      "head shown first (default: the best induction head); the sentence, embedding, variant and "
                      "model options, --query and --precision are refused with it (weights show 3 decimals)")
    # None: not given, so --training can open on the best induction head; a sentence's page uses 0.
    view.set_defaults(run=run_view, layer=None, head=None)


def add_compare_command(commands) -> None:
    """``selfattn compare``: one token in two sentences, side by side."""
    compare = commands.add_parser(
        "compare",
        help="one token in two sentences, side by side",
        description=(
            "Compare one query token in two sentences: for every layer and head, the three tokens it attends "
            "to most in each sentence and how spread its weights are (entropy, in bits). With --model, also "
            "the cosine of the query's two vectors after each layer and the two sentences' similarity. "
            "Without --model it runs a toy variant, with the same options as explain."
        ),
    )
    compare.epilog = COMPARE_EXAMPLES
    compare.add_argument("sentence_a", metavar="SENTENCE_A", help="the first sentence, quoted")
    compare.add_argument("sentence_b", metavar="SENTENCE_B", help="the second sentence, quoted")
    add_input_options(compare, sentence=False, query=False)
    compare.add_argument("--query", required=True, metavar="TOKEN", help=COMPARE_QUERY_HELP)
    compare.add_argument("--precision", type=int, default=2, metavar="DIGITS",
                         help="decimals of the weights and entropies, 0 to 10 (default 2); cosines get one more")
    compare.add_argument("--format", choices=["text", "json", "markdown"], default="text", help="output format")
    compare.set_defaults(run=run_compare)


def config_from_args(args: argparse.Namespace, output_format: str):
    from selfattn.commands.explain_options import ExplainConfig

    return ExplainConfig(
        sentence=" ".join(args.sentence) if args.sentence else None,
        embeddings=args.embeddings,
        embed=args.embed,
        dim=args.dim,
        seed=args.seed,
        query=args.query,
        precision=getattr(args, "precision", 4),
        format=output_format,
        variant=args.variant,
        heads=args.heads,
        kv_heads=args.kv_heads,
        d_k=args.d_k,
        positional=args.positional,
        block_size=args.block_size,
        model=args.model,
        # With a model the layer and head pick what to trace. plot and view also use them for
        # the variants (passed on their own); explain refuses them without a model.
        layer=args.layer if args.model or output_format not in ("plot", "html") else None,
        head=args.head if args.model or output_format not in ("plot", "html") else None,
    )


def run_explain(args: argparse.Namespace) -> int:
    from selfattn.commands.explain_options import check_inputs

    config = config_from_args(args, args.format)
    check_inputs(config)  # the sentence, the query, the embeddings file: before torch loads
    from selfattn.commands.explain import explain_command

    explain_command(config, sys.stdout)
    return 0


# The options of a sentence's attention, with their defaults: --training refuses any given another value.
_SENTENCE_OPTIONS = {"sentence": [], "embeddings": None, "embed": "auto", "dim": None, "seed": 0, "variant": "simple",
                     "heads": None, "kv_heads": None, "d_k": None, "block_size": None, "positional": "none",
                     "model": None, "query": None}


def _refuse_with_training(args: argparse.Namespace, **more_defaults) -> None:
    """A training run's pictures read the run's own probe: refuse the options of a sentence's attention."""
    _refuse_sentence_options(args, "--training draws the run's own probe and heads", **more_defaults)


def _refuse_sentence_options(args: argparse.Namespace, reason: str, **more_defaults) -> None:
    """Refuse every option of a sentence's attention given another value than its default."""
    from selfattn.errors import OptionError

    defaults = dict(_SENTENCE_OPTIONS, **more_defaults)
    given = [name for name, default in defaults.items() if getattr(args, name, default) != default]
    if given:
        names = ["a sentence" if name == "sentence" else "--" + name.replace("_", "-") for name in given]
        raise OptionError(f"{reason}: it does not take {', '.join(names)}")


def run_plot(args: argparse.Namespace) -> int:
    if args.training is not None or args.kind == "training":
        from selfattn.errors import OptionError

        if args.training is None:
            raise OptionError("--kind training draws a training run: give its folder with --training DIR")
        if args.kind != "training":
            raise OptionError(f"--training goes with --kind training, not --kind {args.kind}")
        _refuse_with_training(args, layer=0, head=0, mask=None, tile=None, length=None, mask_mod=None)
        from selfattn.commands.plot_options import check_training_picture
        from selfattn.render.visual.output_files import PICTURE_EXTENSIONS

        check_training_picture(args.training, args.output, PICTURE_EXTENSIONS)
        from selfattn.commands.training_pictures import plot_training

        print(f"wrote {plot_training(args.training, args.output)}")
        return 0
    if args.length is not None or args.mask_mod is not None:
        return _run_block_map(args)
    from selfattn.commands.plot_options import check_plot_options

    config = config_from_args(args, "plot")
    options = dict(layer=args.layer, head=args.head, mask=args.mask, dim=args.dim, tile=args.tile,
                   fixed_scale=args.fixed_scale)
    check_plot_options(config, args.kind, args.output, **options)  # before torch loads
    from selfattn.commands.plot import plot

    path = plot(config, args.kind, args.output, **options)
    print(f"wrote {path}")
    return 0


def _run_block_map(args: argparse.Namespace) -> int:
    """plot --kind mask --length N: a mask's block map at N positions, no sentence involved."""
    from selfattn.errors import OptionError

    given = "--length" if args.length is not None else "--mask-mod"
    if args.kind != "mask":
        raise OptionError(f"{given} applies to --kind mask")
    if args.length is None:
        raise OptionError("--mask-mod draws a block map: give its length with --length N")
    if args.block_size is not None:
        raise OptionError("--block-size is the flash variant's keys per block: give the block map's block size with --tile")
    _refuse_sentence_options(args, "--length draws a mask's block map, not a sentence's attention", layer=0, head=0)
    from selfattn.commands.plot_options import check_block_map_options

    check_block_map_options(args.output, length=args.length, tile=args.tile, mask=args.mask, mask_mod=args.mask_mod)
    from selfattn.commands.block_map import plot_block_map

    path = plot_block_map(args.output, length=args.length, tile=args.tile, mask=args.mask, mask_mod=args.mask_mod)
    print(f"wrote {path}")
    return 0


def run_view(args: argparse.Namespace) -> int:
    if args.training is not None:
        _refuse_with_training(args, precision=4)
        from selfattn.commands.plot_options import check_training_picture
        from selfattn.render.visual.output_files import PAGE_EXTENSIONS

        check_training_picture(args.training, args.output, PAGE_EXTENSIONS)
        from selfattn.commands.training_pictures import view_training

        print(f"wrote {view_training(args.training, args.output, layer=args.layer, head=args.head)}")
        return 0
    args.layer = 0 if args.layer is None else args.layer
    args.head = 0 if args.head is None else args.head
    from selfattn.commands.plot_options import check_view_options

    config = config_from_args(args, "html")
    check_view_options(config, args.output, layer=args.layer, head=args.head)  # before torch loads
    from selfattn.commands.plot import view

    path = view(config, args.output, layer=args.layer, head=args.head)
    print(f"wrote {path}")
    return 0


def run_compare(args: argparse.Namespace) -> int:
    from selfattn.analysis.inputs import COMPARE_OPTIONS
    from selfattn.commands.compare_options import check_compare
    from selfattn.render.text.command_output import check_output

    check_output(args.format, args.precision)  # before any work
    options = {name: getattr(args, name) for name in COMPARE_OPTIONS}  # explain's input flags, one field each
    check_compare(args.sentence_a, args.sentence_b, args.query, args.model, **options)  # before torch loads
    from selfattn.commands.compare import compare
    from selfattn.render.text.compare_render import render_comparison

    comparison = compare(args.sentence_a, args.sentence_b, args.query, model=args.model, **options)
    render_comparison(comparison, args.format, args.precision, sys.stdout)
    return 0
