"""What the model commands check before a model loads: heads, similarity, generate, ablate and patch.

The output format and precision, the probe's options, a file of texts, the sentences, the
heads to knock out and how, and the model's name (``locate.model_key``: a name that is not
there is refused here). Plain Python, no torch: each command calls its check first, and
the command line calls it before torch loads, so a bad argument is one line at once.
"""

from __future__ import annotations

import re
from pathlib import Path

from selfattn.analysis.inputs import ABLATION_MODES, check_probe_options
from selfattn.errors import ModelError, OptionError, SentenceError, did_you_mean
from selfattn.render.text.command_output import check_output, check_sentence, label
from selfattn.models import locate
from selfattn.models.families import decoder_family_names
from selfattn.models.files import model_spec
from selfattn.models.generation_options import check_generation_options
from selfattn.pipeline.embedding_options import SEED_SENTENCE
from selfattn.render.visual.output_files import PICTURE_EXTENSIONS, check_output_path

MAX_SIMILARITY_SENTENCES = 64
HEAD_PAIR = re.compile(r"\s*(\d+)\.(\d+)\s*")


def check_heads_options(sentence: str | None, model_name, output_format: str, precision: int,
                        probe: str | None = None, probe_length: int | None = None, seed: int | None = None,
                        texts_file: str | None = None) -> list[str] | None:
    """``heads``'s checks before its model loads, in its order; returns the texts of ``texts_file`` (None without).

    Raises:
        OptionError: an unknown format or precision; probe options that cannot work;
            --texts with a sentence or a probe, or a texts file that cannot be read or
            holds no text.
        SentenceError: the sentence (or a text of the file) is empty.
        ModelError: the model is not there.
    """
    check_output(output_format, precision)
    check_probe_options(sentence, probe, probe_length, seed)
    if texts_file is not None and (sentence is not None or probe is not None):
        raise OptionError("--texts gives the inputs: give no sentence and no --probe with it")
    texts = read_texts(texts_file) if texts_file is not None else None
    if probe is None and texts is None:
        check_sentence(SEED_SENTENCE if sentence is None else sentence)
    locate.model_key(model_name)
    return texts


def read_texts(path: str) -> list[str]:
    """The texts of a file, one a line (blank lines skipped).

    Raises:
        OptionError: the file cannot be read, is not UTF-8, or holds no text.
        SentenceError: a text is not usable (named by its line).
    """
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise OptionError(f"--texts {path}: no such file") from None
    except IsADirectoryError:
        raise OptionError(f"--texts {path} is a folder: give a file with one text a line") from None
    except UnicodeDecodeError:
        raise OptionError(f"--texts {path} is not UTF-8 text") from None
    except OSError as error:
        raise OptionError(f"--texts {path} cannot be read: {error.strerror or error}") from None
    texts = [line.strip() for line in lines if line.strip()]
    if not texts:
        raise OptionError(f"--texts {path} holds no text: write one text a line")
    for index, line in enumerate(texts):
        try:
            check_sentence(line)
        except SentenceError as error:
            raise SentenceError(f"--texts {path}, text {index + 1}: {error}") from None
    return texts


def check_similarity_options(sentences, model_name, output_format: str, precision: int) -> None:
    """``similarity``'s checks before its model loads: format, precision, the sentences, the model's name."""
    check_output(output_format, precision)
    check_sentences(sentences)
    locate.model_key(model_name)


def check_sentences(sentences) -> None:
    """Refuse anything but a list of 2 to ``MAX_SIMILARITY_SENTENCES`` non-empty strings.

    Args:
        sentences: what the user gave as the sentences.

    Raises:
        OptionError: not a list or tuple, or too few or too many sentences.
        SentenceError: a sentence is not a non-empty string.
    """
    if isinstance(sentences, str) or not isinstance(sentences, (list, tuple)):
        raise OptionError("give the sentences as a list of strings")
    if not 2 <= len(sentences) <= MAX_SIMILARITY_SENTENCES:
        raise OptionError(
            f"similarity compares 2 to {MAX_SIMILARITY_SENTENCES} sentences, got {len(sentences)}: "
            'quote each one, e.g. selfattn similarity "A cat sat" "A dog ran"'
        )
    for index, sentence in enumerate(sentences):
        check_sentence(sentence, f"sentence {label(index)}")


def check_generate_options(model_name, max_new_tokens, temperature, top_k, top_p, seed) -> None:
    """``generate``'s checks before its model loads: the sampling options, then that the model is a decoder.

    Raises:
        OptionError: an option out of range (``check_generation_options``).
        ModelError: the model is not there (the message lists what generates), or is
            the built-in encoder.
    """
    check_generation_options(max_new_tokens, temperature, top_k, top_p, seed)
    key = locate.model_key(model_name, decoder=True)
    if locate.is_builtin(key) and model_spec(key).kind == "encoder":
        raise not_a_decoder(key)


def not_a_decoder(name: str) -> ModelError:
    """The error for generating with an encoder, naming the families that generate."""
    families = decoder_family_names()
    return ModelError(
        f"{name} is an encoder (BERT): it has no next-token head to generate with; "
        f"give a {', '.join(families[:-1])} or {families[-1]} model"
    )


def parse_heads(spec: str, flag: str = "--heads") -> list[tuple[int, int]]:
    """--heads "1.0,1.3" -> [(1, 0), (1, 3)] (``flag`` names the option in the message).

    Raises:
        OptionError: not LAYER.HEAD pairs of whole numbers separated by commas.
    """
    pairs = []
    for part in str(spec).split(","):
        match = HEAD_PAIR.fullmatch(part)
        if match is None:
            raise OptionError(
                f"{flag} takes LAYER.HEAD pairs separated by commas, counted from 0, like 1.0,1.3: {part.strip()!r} "
                f"in {spec!r} is not one")
        pairs.append((int(match[1]), int(match[2])))
    return pairs


def check_ablate_options(text: str | None, model_name, heads: str, mode: str, output_format: str, precision: int,
                         probe: str | None = None, probe_length: int | None = None,
                         seed: int | None = None) -> list[tuple[int, int]]:
    """``ablate``'s checks before its model loads, in its order; returns the (layer, head) pairs.

    Raises:
        OptionError: an unknown format or precision, malformed --heads, an unknown mode,
            probe options that cannot work, neither a text nor a probe.
        SentenceError: the text is empty.
        ModelError: the model is not there.
    """
    check_output(output_format, precision)
    pairs = parse_heads(heads)
    if mode not in ABLATION_MODES:
        raise OptionError(f"unknown --mode {mode!r}: choose one of {', '.join(ABLATION_MODES)}{did_you_mean(mode, ABLATION_MODES)}")
    check_probe_options(text, probe, probe_length, seed)
    if text is None and probe is None:
        raise OptionError("give a TEXT to score, or --probe induction")
    if text is not None:
        check_sentence(text, "the text")
    locate.model_key(model_name)
    return pairs


def check_patch_options(clean: str, corrupted: str, model_name, output_format: str, precision: int,
                        output_file: str | None = None, senders: str | None = None, receivers: str | None = None,
                        via: str | None = None, positions: str | None = None) -> tuple[Path | None, dict]:
    """``patch``'s checks before its model loads.

    Returns:
        (the picture's path or None, the path options as ``patch_heads`` takes them:
        senders, receivers, via, positions; absent ones None).

    Raises:
        OptionError: an unknown format or precision; malformed --senders, --receivers or
            --positions; --senders without --receivers (or the other way); --via without
            them, or a letter other than q, k, v; a picture with path patching (one number).
        SentenceError: an input is empty.
        OutputError: the picture cannot be written there, or is not .png or .svg.
        ModelError: the model is not there.
    """
    check_output(output_format, precision)
    check_sentence(clean, "the clean text")
    check_sentence(corrupted, "the corrupted text")
    path = {"senders": None, "receivers": None, "via": None, "positions": None}
    if (senders is None) != (receivers is None):
        raise OptionError("path patching needs --senders and --receivers together")
    if senders is not None:
        path["senders"], path["receivers"] = parse_heads(senders, "--senders"), parse_heads(receivers, "--receivers")
        if output_file is not None:
            raise OptionError("path patching gives one number: -o draws the per-head table, without --senders")
        if via is not None and (not via or any(x not in "qkv" for x in via) or len(set(via)) != len(via)):
            raise OptionError(f"--via names the receivers' inputs: q, k, v or several (qk, qkv), got {via!r}")
        path["via"] = via
    elif via is not None:
        raise OptionError("--via goes with --senders and --receivers (path patching)")
    if positions is not None:
        if not re.fullmatch(r"\d+(,\d+)*", positions):
            raise OptionError(f"--positions takes whole numbers from 0 separated by commas (3,7,8), got {positions!r}")
        path["positions"] = sorted({int(p) for p in positions.split(",")})
    target = None if output_file is None else check_output_path(output_file, PICTURE_EXTENSIONS)
    locate.model_key(model_name)
    return target, path


def check_attribute_options(text: str, model_name, output_format: str, precision: int, position,
                            output_file: str | None = None) -> Path | None:
    """``attribute``'s checks before its model loads; returns the picture's path (None without -o).

    Raises:
        OptionError: an unknown format or precision, a negative position.
        SentenceError: the text is empty.
        OutputError: the picture cannot be written there, or is not .png or .svg.
        ModelError: the model is not there.
    """
    check_output(output_format, precision)
    check_sentence(text, "the text")
    if position is not None and position < 0:
        raise OptionError(f"--position counts tokens from 0, got {position}")
    target = None if output_file is None else check_output_path(output_file, PICTURE_EXTENSIONS)
    locate.model_key(model_name)
    return target


def check_composition_options(sentence: str | None, model_name, output_format: str, precision: int,
                              input_options: bool) -> None:
    """``heads --composition``'s checks before its model loads.

    Raises:
        OptionError: an unknown format or precision; a sentence, a probe, --texts or --ablation with it.
        ModelError: the model is not there.
    """
    check_output(output_format, precision)
    if sentence is not None or input_options:
        raise OptionError("--composition reads the weights alone: give no sentence, --probe, --texts or --ablation "
                          "with it")
    locate.model_key(model_name)
