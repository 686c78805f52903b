"""The ``selfattn`` command line.

User mistakes print one line on stderr and exit with status 2; heavy libraries (torch,
rich) are imported only once a command runs, so ``--help`` answers at once.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from typing import Sequence

from selfattn import __version__
from selfattn.viz import PLOT_KINDS

EXIT_USAGE = 2

QUERY_HELP = (
    "the query token, case-sensitive ('The' and 'the' differ). A repeated token picks its first "
    "occurrence; to pick another, give its 0-based position instead (in 'the cat saw the dog', "
    "--query 3 is the second 'the'). A number is read as a position unless the sentence contains it "
    "as a word. Default: the token at position 1, as the seed picks 'cat'"
)

COMPARE_QUERY_HELP = (
    "the query token, looked up in each sentence on its own (required). Case-sensitive for the toy variants; "
    "with --model one of the model's WordPiece tokens, in any case ([CLS] is 0); a word the model cuts into "
    "pieces is refused with the pieces named. A repeated token picks its first occurrence; a 0-based "
    "position picks that position in both sentences"
)


EXPLAIN_EXAMPLES = """examples:
  selfattn explain                              the seed's example, query 'cat'
  selfattn explain --query the --precision 6    another query, more decimals
  selfattn explain "the cat saw the dog" --query 3 --embed random --dim 4
  selfattn explain "my words" --embeddings table.json --format markdown
  selfattn explain --format json > trace.json   every number, full precision
  selfattn explain --variant scaled             divide the scores by sqrt(d)
  selfattn explain --variant causal --d-k 2     Q/K/V projections and a causal mask
  selfattn explain --variant gqa --heads 4 --kv-heads 2 --positional rope
  selfattn explain --variant flash --block-size 2   the online softmax, key block by key block
  selfattn explain --model all-MiniLM-L6-v2 --layer 2 --head 5 --query cat
                                                a real pretrained model's head
"""

MODEL_NAME = "all-MiniLM-L6-v2"

HEADS_EXAMPLES = """examples:
  selfattn heads                                         the seed's sentence
  selfattn heads "The cat sat on the warm mat because it was tired"
  selfattn heads "my sentence" --format json > heads.json
"""

COMPARE_EXAMPLES = """examples:
  selfattn compare "I sat by the river bank" "I paid at the bank" --query bank
  selfattn compare "I sat by the river bank" "I paid at the bank" --query bank \\
      --model all-MiniLM-L6-v2         a real model: every layer and head, and the vectors' cosines
  selfattn compare "the cat saw the dog" "a dog saw the cat" --query cat --variant multihead --dim 8
  selfattn compare "the cat sat" "the cat ran" --query 1 --format json > compare.json
"""

SIMILARITY_EXAMPLES = """examples:
  selfattn similarity "The cat sat on the mat" "A kitten rested on the rug" "Stocks fell sharply"
  selfattn similarity "first" "second" --format json
"""


PLOT_EXAMPLES = """examples:
  selfattn plot --kind heatmap -o weights.png            the seed's weight matrix
  selfattn plot --kind arrows --query cat -o cat.svg      the seed's picture of 'cat' attending
  selfattn plot --variant multihead --heads 4 --kind heads -o heads.png
  selfattn plot --kind mask --mask sliding-window:3 -o window.png
  selfattn plot --kind positional --positional rope --dim 64 -o rope.png
  selfattn plot --model all-MiniLM-L6-v2 --layer 2 --head 5 --kind heatmap -o head.png
  selfattn plot --model all-MiniLM-L6-v2 --kind heads -o heads.png   every layer x head
"""


VIEW_EXAMPLES = """examples:
  selfattn view -o explorer.html                  the seed's example; open it in a browser
  selfattn view --variant causal -o causal.html   Q/K/V and a causal mask
  selfattn view "the cat saw the dog" --variant gqa --heads 4 --embed random --dim 8 -o gqa.html
  selfattn view --model all-MiniLM-L6-v2 --layer 2 --head 5 -o minilm.html
                                                  a real model: every layer and head
"""


class _Formatter(argparse.HelpFormatter):
    """Wraps prose to the terminal's width; keeps indented lines (the examples) as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines, prose = [], []
        for line in text.splitlines() + [""]:
            if line.strip() and not line[0].isspace():
                prose.append(line)
                continue
            if prose:
                lines += textwrap.wrap(" ".join(prose), width, initial_indent=indent, subsequent_indent=indent)
                prose = []
            lines.append(indent + line if line.strip() else "")
        return "\n".join(lines).rstrip("\n")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit status 2, and help is wrapped."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="selfattn",
        description="Transformer self-attention from scratch, every step explained with real numbers.",
    )
    parser.add_argument("--version", action="version", version=f"selfattn {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

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
    explain.add_argument("--precision", type=int, default=4, metavar="DIGITS", help="decimals shown, 0 to 10 (default 4)")
    explain.add_argument("--format", choices=["text", "json", "markdown"], default="text", help="output format")
    explain.set_defaults(run=run_explain)

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
        "default all but 2) | documents[:A,B,...] (packed documents, default two halves) | none. "
        "Default: the variant's own mask",
    )
    plot.add_argument("--tile", type=int, metavar="N",
                      help="for --kind mask: tiles of N x N in the block map (skipped / full / partial), default 2")
    plot.set_defaults(run=run_plot)

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
    view.set_defaults(run=run_view)

    heads = commands.add_parser(
        "heads",
        help="what every head of a pretrained model does on a sentence",
        description=(
            "For every layer and head of a pretrained model, what the head mostly does on this input "
            "(looks at the previous token, the next token, itself, [CLS]/[SEP], or spreads its attention) "
            "and how spread out its weights are (entropy), so you can find the heads worth a closer look."
        ),
    )
    heads.epilog = HEADS_EXAMPLES
    heads.add_argument("sentence", nargs="*", help="the sentence (default: the seed's example)")
    add_model_option(heads)
    heads.add_argument("--precision", type=int, default=2, metavar="DIGITS", help="decimals shown, 0 to 10 (default 2)")
    heads.add_argument("--format", choices=["text", "json", "markdown"], default="text", help="output format")
    heads.set_defaults(run=run_heads)

    similarity = commands.add_parser(
        "similarity",
        help="cosine similarity of sentence embeddings",
        description=(
            "Embed each sentence with a pretrained model (mean of its token vectors, normalised) and print "
            "the cosine similarity of every pair: 1 = same direction, 0 = unrelated."
        ),
    )
    similarity.epilog = SIMILARITY_EXAMPLES
    similarity.add_argument("sentences", nargs="+", metavar="SENTENCE", help="two or more sentences, each quoted")
    add_model_option(similarity)
    similarity.add_argument("--precision", type=int, default=3, metavar="DIGITS", help="decimals shown, 0 to 10 (default 3)")
    similarity.add_argument("--format", choices=["text", "json", "markdown"], default="text", help="output format")
    similarity.set_defaults(run=run_similarity)

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
    return parser


def add_model_option(command: argparse.ArgumentParser, default: str | None = MODEL_NAME) -> None:
    note = f" (default {default})" if default else " instead of the toy embeddings and variants"
    command.add_argument(
        "--model", default=default, metavar="MODEL",
        help=f"a pretrained model, installed as a Python package: {MODEL_NAME}{note}",
    )


def add_input_options(command: argparse.ArgumentParser, sentence: bool = True, query: bool = True) -> None:
    """The sentence, its embeddings, the attention variant and the query: shared by every command.

    compare takes two sentences and its own --query, so it asks for neither here.
    """
    if sentence:
        command.add_argument(
            "sentence", nargs="*", help="the sentence, quoted or as separate words (default: the seed's example)"
        )
    source = command.add_argument_group("embeddings (default: the seed's table if it knows every token, else random)")
    source.add_argument(
        "--embeddings",
        metavar="FILE",
        help="a table from a file: a JSON object token -> vector, or a matrix with one row per token "
        "as .json, .csv, .npy, .pt or .safetensors",
    )
    source.add_argument(
        "--embed",
        choices=["auto", "seed", "random"],
        default="auto",
        help="seed: the seed's 3-d table; random: seeded, untrained N(0, 1) vectors (default: auto)",
    )
    source.add_argument("--dim", type=int, metavar="D", help="width of random embeddings, 1 to 1024 (default 3)")
    source.add_argument(
        "--seed", type=int, default=0, metavar="S",
        help="seed for random embeddings and untrained projection weights (default 0)",
    )
    variant = command.add_argument_group("attention variant (default: the seed's simple attention)")
    variant.add_argument(
        "--variant",
        default="simple",
        metavar="VARIANT",
        help="simple | scaled (divide by sqrt(d)) | qkv (Q/K/V projections, untrained) | causal (+ mask) | "
        "multihead (+ heads, output projection) | gqa (query heads share key/value heads) | "
        "flash (the seed's attention, keys folded in block by block with the online softmax)",
    )
    variant.add_argument("--heads", type=int, metavar="H", help="query heads for multihead (default 2) and gqa (default 4)")
    variant.add_argument("--kv-heads", type=int, metavar="K", help="key/value heads for gqa (default heads / 2)")
    variant.add_argument("--d-k", type=int, metavar="DK", help="width of each head's queries and keys (default d / heads, at least 2)")
    variant.add_argument("--block-size", type=int, metavar="KEYS", help="keys per block for flash, 1 or more (default 2)")
    variant.add_argument(
        "--positional",
        default="none",
        metavar="ENCODING",
        help="none | sinusoidal | learned (untrained) | rope | alibi (default none)",
    )
    pretrained = command.add_argument_group("pretrained model (instead of the embeddings and variant above)")
    add_model_option(pretrained, default=None)
    if query:
        command.add_argument("--query", metavar="TOKEN", help=QUERY_HELP)


def add_view_options(command: argparse.ArgumentParser, default: int | None = 0, needs: str = "") -> None:
    """--layer and --head. explain uses them only with --model; plot and view also pick a variant's head."""
    head_needs = needs or "of --model, or of --variant multihead or gqa"
    command.add_argument("--layer", type=int, default=default, metavar="LAYER",
                         help="the layer to show, from 0 (default 0); needs --model (the variants have one layer)")
    command.add_argument("--head", type=int, default=default, metavar="HEAD", help=f"the head to show, from 0 (default 0); {head_needs}")


def config_from_args(args: argparse.Namespace, output_format: str):
    from selfattn.config import ExplainConfig

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
    from selfattn.config import build_trace

    config = config_from_args(args, args.format)
    trace = build_trace(config)

    if args.format == "json":
        from selfattn.explain.json_out import render_json

        sys.stdout.write(render_json(trace))
        return 0
    from selfattn.trace import Trace
    from selfattn.variant_trace import VariantTrace

    if isinstance(trace, Trace):
        from selfattn.explain.walkthrough import walkthrough

        doc = walkthrough(trace, config.precision)
    elif not isinstance(trace, VariantTrace):
        from selfattn.explain.model_walkthrough import model_walkthrough

        doc = model_walkthrough(trace, config.precision)
    else:
        from selfattn.explain.variant_walkthrough import variant_walkthrough

        doc = variant_walkthrough(trace, config.precision)
    if args.format == "markdown":
        from selfattn.explain.markdown import render_markdown

        sys.stdout.write(render_markdown(doc))
    else:
        from selfattn.explain.text import render_text

        render_text(doc, sys.stdout)
    return 0


def run_plot(args: argparse.Namespace) -> int:
    from selfattn.viz.commands import plot

    path = plot(config_from_args(args, "plot"), args.kind, args.output, layer=args.layer, head=args.head, mask=args.mask, dim=args.dim, tile=args.tile)
    print(f"wrote {path}")
    return 0


def run_view(args: argparse.Namespace) -> int:
    from selfattn.viz.commands import view

    path = view(config_from_args(args, "html"), args.output, layer=args.layer, head=args.head)
    print(f"wrote {path}")
    return 0


def run_heads(args: argparse.Namespace) -> int:
    from selfattn.explain.model_commands import heads_command

    sentence = " ".join(args.sentence) if args.sentence else None
    heads_command(sentence, args.model, args.format, args.precision, sys.stdout)
    return 0


def run_similarity(args: argparse.Namespace) -> int:
    from selfattn.explain.model_commands import similarity_command

    similarity_command(args.sentences, args.model, args.format, args.precision, sys.stdout)
    return 0


def run_compare(args: argparse.Namespace) -> int:
    from selfattn.comparison import OPTIONS, compare
    from selfattn.explain.compare_render import render_comparison
    from selfattn.explain.model_commands import check_output

    check_output(args.format, args.precision)  # before any work
    options = {name: getattr(args, name) for name in OPTIONS}  # explain's input flags, one field each
    comparison = compare(args.sentence_a, args.sentence_b, args.query, model=args.model, **options)
    render_comparison(comparison, args.format, args.precision, sys.stdout)
    return 0


def check_text_arguments(args: argparse.Namespace) -> None:
    """Sentences and queries must be text: bytes that are not UTF-8 are refused before any work."""
    from selfattn.errors import QueryError
    from selfattn.pipeline.tokenize import check_text

    if getattr(args, "sentence", None):
        check_text(" ".join(args.sentence))
    for index, sentence in enumerate(getattr(args, "sentences", None) or []):
        check_text(sentence, f"sentence {index + 1}")
    for label in ("a", "b"):
        if getattr(args, f"sentence_{label}", None) is not None:
            check_text(getattr(args, f"sentence_{label}"), f"sentence {label.upper()}")
    if getattr(args, "query", None) is not None:
        check_text(args.query, "the query", QueryError)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    from selfattn.errors import SelfAttnError

    # Greek letters and box drawing must not crash a stdout that cannot encode them, and a file
    # name given in bytes that are not UTF-8 prints as those bytes.
    if hasattr(sys.stdout, "reconfigure"):
        utf8 = (sys.stdout.encoding or "").lower().replace("-", "") == "utf8"
        sys.stdout.reconfigure(errors="surrogateescape" if utf8 else "replace")
    try:
        check_text_arguments(args)
        return args.run(args)
    except SelfAttnError as error:
        message = " ".join(str(error).split())
        print(f"selfattn: error: {message}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # The reader went away (e.g. `| head`); stop quietly, as other tools do.
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        return 130
