"""The command line's ``ablate``, ``patch`` and ``attribute``: knock heads out of a decoder, patch them in,
split a logit among them."""

from __future__ import annotations

import argparse
import sys

from selfattn.cli.options import add_model_option, add_output_options, add_probe_options

ABLATE_EXAMPLES = """examples:
  selfattn ablate --model tiny-induction --heads 1.0,1.1,1.2,1.3 --probe induction
                                                   the induction heads out: the repeat's loss jumps
  selfattn ablate --model tiny-induction --heads 0.2,0.3 --probe induction
                                                   the previous-token heads out
  selfattn ablate --model stories260K --heads 1.0 "Once upon a time, there was a little girl"
  selfattn ablate --model stories260K --heads 1.0 --mode mean --probe induction --format json
  selfattn ablate --model stories260K --heads 1.2,1.4 --generate 20 "Tim had a red ball. He gave the ball to"
                                                   the text the model writes with and without the heads
"""

PATCH_EXAMPLES = """examples:
  selfattn patch "abcdefghijklmnopabcdefghij" "abcdefghijklmnopabcdefghiw" --model tiny-induction --target k
  selfattn patch "abcdefghijklmnopabcdefghij" "abcdefghiwklmnopabcdefghij" --model tiny-induction --target k \\
      --senders 0.3 --receivers 1.0 --via k         does the induction head read the previous-token head's keys?
  selfattn patch "CLEAN" "CORRUPTED" --model stories260K --target TOKEN -o patch.png
"""


ATTRIBUTE_EXAMPLES = """examples:
  selfattn attribute "kqbxkqb" --model tiny-induction --target x
                                                   which heads write the repeated token's logit
  selfattn attribute "The cat sat on the mat. The cat sat on the" --model SmolLM2-135M-Instruct --target " mat" -o dla.png
"""


def add_intervention_commands(commands) -> None:
    """Add ``ablate``, ``patch`` and ``attribute`` to the subcommands."""
    ablate = commands.add_parser(
        "ablate",
        help="knock heads out of a decoder and see the loss and the next token change",
        description=(
            "Run a decoder on a text (or the induction probe) with every head, and again with the named heads "
            "knocked out: set to zero (--mode zero, the default) or to their mean over the input's positions "
            "(--mode mean), before the output projection. Prints the mean next-token loss in nats before and "
            "after (over every predicted token of the text; with the probe, over its second copy), the tokens "
            "whose loss changed most, and the five most likely next tokens at the end, before and after."),
    )
    ablate.epilog = ABLATE_EXAMPLES
    ablate.add_argument("text", nargs="*", metavar="TEXT", help="the text to score (or give --probe induction)")
    add_model_option(ablate, default=None)
    ablate.add_argument("--heads", required=True, metavar="L.H[,L.H...]",
                        help="the heads to knock out, LAYER.HEAD counted from 0, separated by commas: 1.0,1.3")
    ablate.add_argument("--mode", default="zero", metavar="MODE", help="zero (default) or mean")
    add_output_options(ablate, 3)
    generate = ablate.add_argument_group("the text written with and without the heads")
    generate.add_argument("--generate", type=int, metavar="N",
                          help="also continue the input by N tokens with every head and with the heads knocked out")
    generate.add_argument("--temperature", type=float, default=0.0, metavar="T",
                          help="with --generate: 0 (default) picks the likeliest token; above 0 draws")
    generate.add_argument("--top-k", type=int, metavar="K", help="with --generate: draw among the K likeliest")
    generate.add_argument("--top-p", type=float, metavar="P", help="with --generate: draw from the top-p nucleus")
    generate.add_argument("--generate-seed", type=int, default=0, metavar="S",
                          help="with --generate: the draws' seed (default 0: the same text every run)")
    add_probe_options(ablate, "probe (instead of a text)",
                      "induction: random tokens, then the same again; the loss is read on the second copy")
    ablate.set_defaults(run=run_ablate)

    patch = commands.add_parser(
        "patch",
        help="activation patching: which heads carry the difference between two texts",
        description=(
            "Run a decoder on the corrupted text once per head, each time with that head's output taken from "
            "the clean text's run, and print the share of the target token's log-probability each head brings "
            "back: (lp_patched - lp_corrupted) / (lp_clean - lp_corrupted). The two texts must have the same "
            "number of tokens. -o FILE.png draws it as a heatmap. With --senders and --receivers, path patching: "
            "only the senders' clean output reaches only the receivers' inputs named by --via (everything else "
            "as in the corrupted run), and the one fraction that path brings back is printed. --positions lets "
            "the clean output in at those positions only."),
    )
    patch.epilog = PATCH_EXAMPLES
    patch.add_argument("clean", metavar="CLEAN", help="the text whose next token is the target, quoted")
    patch.add_argument("corrupted", metavar="CORRUPTED", help="a text of as many tokens that changes the answer, quoted")
    add_model_option(patch, default=None)
    patch.add_argument("--target", required=True, metavar="TOKEN",
                       help="the next token to read: as the vocabulary writes it (Ġcat, ▁cat) or as text of one token")
    add_output_options(patch, 2)
    patch.add_argument("-o", "--output", metavar="FILE", help="also draw the heatmap to FILE (.png or .svg)")
    patch.add_argument("--senders", metavar="L.H[,L.H...]", help="path patching: the heads whose clean output is sent")
    patch.add_argument("--receivers", metavar="L.H[,L.H...]",
                       help="path patching: the heads that receive it (in later layers than every sender)")
    patch.add_argument("--via", metavar="q|k|v", help="the receivers' inputs that receive it: q, k, v or several "
                                                       "(qkv, the default)")
    patch.add_argument("--positions", metavar="P[,P...]",
                       help="let the clean output in at these positions only (from 0; default every position)")
    patch.set_defaults(run=run_patch)

    attribute = commands.add_parser(
        "attribute",
        help="direct logit attribution: each head's share of the target token's logit",
        description=(
            "Run a decoder on a text once and split the logit of the target token at one position (the last "
            "by default) into what each part of the residual stream wrote: every head (its output through "
            "W_o), the embeddings, each MLP and the biases, each through the final norm with its scale "
            "frozen at the run's value, then the unembedding. The shares add up to the model's logit. "
            "-o FILE.png draws the heads' shares as a layers x heads grid."),
    )
    attribute.epilog = ATTRIBUTE_EXAMPLES
    attribute.add_argument("text", nargs="+", metavar="TEXT", help="the text, quoted")
    add_model_option(attribute, default=None)
    attribute.add_argument("--target", required=True, metavar="TOKEN",
                           help="the token whose logit is split: as the vocabulary writes it (Ġcat, ▁cat) or as "
                                "text of one token")
    attribute.add_argument("--position", type=int, default=None, metavar="P",
                           help="the position whose next-token logit is read, from 0 (default: the last token)")
    add_output_options(attribute, 3)
    attribute.add_argument("-o", "--output", metavar="FILE", help="also draw the heads' shares to FILE (.png or .svg)")
    attribute.set_defaults(run=run_attribute)


def _model(args: argparse.Namespace) -> str:
    from selfattn.errors import OptionError

    if args.model is None:
        raise OptionError(f"{args.command} needs a decoder: give --model (stories260K, tiny-induction, a folder or a file)")
    return args.model


def run_ablate(args: argparse.Namespace) -> int:
    from selfattn.commands.model_options import check_ablate_options

    text = " ".join(args.text) if args.text else None
    pairs = check_ablate_options(text, _model(args), args.heads, args.mode, args.format, args.precision, args.probe,
                                 args.probe_length, args.seed)  # before torch loads
    sampling = None
    if args.generate is not None:
        from selfattn.models.generation_options import check_generation_options

        sampling = (args.generate, args.temperature, args.top_k, args.top_p, args.generate_seed)
        check_generation_options(*sampling)
    elif (args.temperature, args.top_k, args.top_p, args.generate_seed) != (0.0, None, None, 0):
        from selfattn.errors import OptionError

        raise OptionError("--temperature, --top-k, --top-p and --generate-seed shape the text --generate N writes: "
                          "give --generate too")
    from selfattn.commands.interventions import ablate_command

    ablate_command(text, _model(args), pairs, args.mode, args.format, args.precision, sys.stdout,
                   probe=args.probe, probe_length=args.probe_length, seed=args.seed, sampling=sampling)
    return 0


def run_patch(args: argparse.Namespace) -> int:
    from selfattn.commands.model_options import check_patch_options

    picture, path = check_patch_options(args.clean, args.corrupted, _model(args), args.format, args.precision,
                                        args.output, args.senders, args.receivers, args.via,
                                        args.positions)  # before torch loads
    from selfattn.commands.interventions import patch_command

    patch_command(args.clean, args.corrupted, _model(args), args.target, args.format, args.precision, sys.stdout,
                  picture, args.output, path)
    return 0


def run_attribute(args: argparse.Namespace) -> int:
    from selfattn.commands.model_options import check_attribute_options

    text = " ".join(args.text)
    picture = check_attribute_options(text, _model(args), args.format, args.precision, args.position,
                                      args.output)  # before torch loads
    from selfattn.commands.interventions import attribute_command

    attribute_command(text, _model(args), args.target, args.position, args.format, args.precision, sys.stdout,
                      picture, args.output)
    return 0
