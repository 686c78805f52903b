"""The ``selfattn`` command line.

User mistakes print one line on stderr and exit with status 2; heavy libraries (torch,
rich) are imported only once a command runs, so ``--help`` answers at once.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from selfattn import __version__

EXIT_USAGE = 2

QUERY_HELP = (
    "the query token, case-sensitive ('The' and 'the' differ). A repeated token picks its first "
    "occurrence; to pick another, give its 0-based position instead (in 'the cat saw the dog', "
    "--query 3 is the second 'the'). A number is read as a position unless the sentence contains it "
    "as a word. Default: the token at position 1, as the seed picks 'cat'"
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
"""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit status 2."""

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
    explain.formatter_class = argparse.RawDescriptionHelpFormatter
    explain.add_argument(
        "sentence", nargs="*", help="the sentence, quoted or as separate words (default: the seed's example)"
    )
    source = explain.add_argument_group("embeddings (default: the seed's table if it knows every token, else random)")
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
    variant = explain.add_argument_group("attention variant (default: the seed's simple attention)")
    variant.add_argument(
        "--variant",
        default="simple",
        metavar="NAME",
        help="simple | scaled (divide by sqrt(d)) | qkv (learned projections) | causal (+ mask) | "
        "multihead (+ heads, output projection) | gqa (query heads share key/value heads)",
    )
    variant.add_argument("--heads", type=int, metavar="H", help="query heads for multihead (default 2) and gqa (default 4)")
    variant.add_argument("--kv-heads", type=int, metavar="K", help="key/value heads for gqa (default heads / 2)")
    variant.add_argument("--d-k", type=int, metavar="D", help="width of each head's queries and keys (default d / heads, at least 2)")
    variant.add_argument(
        "--positional",
        default="none",
        metavar="NAME",
        help="none | sinusoidal | learned (untrained) | rope | alibi (default none)",
    )
    explain.add_argument("--query", metavar="TOKEN", help=QUERY_HELP)
    explain.add_argument("--precision", type=int, default=4, metavar="N", help="decimals shown, 0 to 10 (default 4)")
    explain.add_argument("--format", choices=["text", "json", "markdown"], default="text", help="output format")
    explain.set_defaults(run=run_explain)
    return parser


def run_explain(args: argparse.Namespace) -> int:
    from selfattn.config import ExplainConfig, build_trace

    config = ExplainConfig(
        sentence=" ".join(args.sentence) if args.sentence else None,
        embeddings=args.embeddings,
        embed=args.embed,
        dim=args.dim,
        seed=args.seed,
        query=args.query,
        precision=args.precision,
        format=args.format,
        variant=args.variant,
        heads=args.heads,
        kv_heads=args.kv_heads,
        d_k=args.d_k,
        positional=args.positional,
    )
    trace = build_trace(config)

    if args.format == "json":
        from selfattn.explain.json_out import render_json

        sys.stdout.write(render_json(trace))
        return 0
    from selfattn.trace import Trace

    if isinstance(trace, Trace):
        from selfattn.explain.walkthrough import walkthrough

        doc = walkthrough(trace, config.precision)
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    from selfattn.errors import SelfAttnError

    # Greek letters and box drawing must not crash a stdout that cannot encode them.
    if hasattr(sys.stdout, "reconfigure") and (sys.stdout.encoding or "").lower().replace("-", "") != "utf8":
        sys.stdout.reconfigure(errors="replace")
    try:
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
