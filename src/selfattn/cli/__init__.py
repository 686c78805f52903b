"""The ``selfattn`` command line: one parser, each command's flags beside the function that runs it.

User mistakes print one line on stderr and exit with status 2; heavy libraries (torch,
rich) are imported only once a command runs, so ``--help`` answers at once.

    options.py               the flags several commands share, the examples under each --help
    sentence_commands.py     explain, plot, view, compare: one sentence's attention
    model_commands.py        heads, similarity, generate, train: a model as a whole
    intervention_commands.py ablate, patch, attribute: knock out, patch and attribute heads
    serve_command.py         serve: the live app
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from selfattn import __version__
from selfattn.cli.intervention_commands import add_intervention_commands
from selfattn.cli.model_commands import (
    add_generate_command,
    add_heads_command,
    add_similarity_command,
    add_train_command,
)
from selfattn.cli.options import EXIT_USAGE, Parser
from selfattn.cli.sentence_commands import (
    add_compare_command,
    add_explain_command,
    add_plot_command,
    add_view_command,
)
from selfattn.cli.serve_command import add_serve_command


def build_parser() -> argparse.ArgumentParser:
    """Every command's parser, in the order ``selfattn --help`` lists them."""
    parser = Parser(
        prog="selfattn",
        description="Transformer self-attention from scratch, every step explained with real numbers.",
    )
    parser.add_argument("--version", action="version", version=f"selfattn {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for add in (add_explain_command, add_plot_command, add_view_command, add_heads_command, add_similarity_command,
                add_generate_command, add_compare_command, add_train_command, add_intervention_commands,
                add_serve_command):
        add(commands)
    return parser


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
    if getattr(args, "prompt", None) is not None:
        check_text(args.prompt, "the prompt")
    if getattr(args, "query", None) is not None:
        check_text(args.query, "the query", QueryError)


def run_command(args: argparse.Namespace) -> int:
    """The command; with --tokenizer FILE (or --dtype), the --model checkpoint loads with that tokenizer
    (or weight type) wherever it runs."""
    tokenizer, dtype = getattr(args, "tokenizer", None), getattr(args, "dtype", None)
    if tokenizer is None and dtype is None:
        return args.run(args)
    from selfattn.errors import ModelError
    from selfattn.models.loading import named_options
    from selfattn.models.locate import check_dtype_model, check_tokenizer_file

    if getattr(args, "model", None) is None:
        raise ModelError("--tokenizer goes with a llama2.c checkpoint given as --model FILE" if tokenizer is not None
                         else "--dtype goes with a GGUF model given as --model")
    if tokenizer is not None:
        check_tokenizer_file(args.model, tokenizer)
    if dtype is not None:
        check_dtype_model(args.model)
    with named_options(args.model, tokenizer, dtype):
        return args.run(args)


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
        return run_command(args)
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
