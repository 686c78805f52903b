"""What ``plot`` and ``view`` check before anything is drawn: the output, the kind and its options.

The output file's folder and extension, the plot kind and the options that go with it,
the toy variants' layer and head, a --mask spec (its form, and with the toy variants its
numbers against the sentence), the block map's length and tile, and a training run's
folder. Plain Python, no torch: ``commands.plot``, ``commands.block_map`` and
``commands.training_pictures`` call these first, and the command line calls them before
torch loads, so a bad argument is one line at once.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from selfattn.commands.explain_options import ExplainConfig, check_toy_inputs
from selfattn.errors import OptionError, TrainingError, did_you_mean
from selfattn.models.files import DEFAULT_MODEL, MODELS, model_folder
from selfattn.pipeline.embedding_options import embedding_width
from selfattn.trace.variant_names import PROJECTED
from selfattn.render.visual import PLOT_KINDS
from selfattn.render.visual.mask_specs import check_spec, spec_keys
from selfattn.render.visual.output_files import PAGE_EXTENSIONS, PICTURE_EXTENSIONS, check_output_path

# The models selfattn trained and ships with their run's records: tiny-induction, tiny-shakespeare
# (stories260K ships too, but was trained elsewhere and has no run folder).
SHIPPED = tuple(name for name, spec in MODELS.items() if name != DEFAULT_MODEL and spec.checkpoint is None)
# The kinds drawn from a sentence's trace (positional and rope-distance build their own inputs).
TRACED_KINDS = ("heatmap", "arrows", "heads", "mask")
BLOCK_MAP_TILE = 128  # the block map's default tile: the block size of create_block_mask and of our kernel's rows
MAX_LENGTH = 1 << 20  # the structured masks' maps cost O(length) to work out
MAX_MASK_MOD_LENGTH = 1 << 16  # a mask_mod is evaluated at every pair: 65536^2 takes minutes on a CPU
MAX_BLOCKS = 4096  # per axis: a picture has no more pixels than that


def check_shown_head(layer: int, head: int, n_layers: int, n_heads: int) -> None:
    """OptionError unless the picture's ``layer`` and ``head`` pick one of ``n_layers`` x ``n_heads``."""
    for name, value, count in (("--layer", layer, n_layers), ("--head", head, n_heads)):
        if not 0 <= value < count:
            noun = name.removeprefix("--")
            raise OptionError(
                f"{name} {value} is out of range: this input has {count} {noun}{'s' if count > 1 else ''} "
                f"(0 to {count - 1})"
            )


def check_plot_options(config: ExplainConfig, kind: str, output, *, layer: int = 0, head: int = 0,
                       mask: str | None = None, dim: int | None = None, tile: int | None = None,
                       fixed_scale: bool = False) -> Path:
    """Every check of ``plot`` that needs no model and no torch, in the order ``plot`` meets them.

    Returns:
        The picture's path.

    Raises:
        OutputError: the path is a folder, has another extension than .png or .svg, or
            its folder is missing or not writable.
        OptionError: an unknown kind, an option that belongs to another kind, a tile
            below 1; with the toy variants a layer or head out of range, a --mask spec
            that does not fit the sentence, or a RoPE width that is odd.
        SentenceError, QueryError, EmbeddingError: as ``check_toy_inputs``.
    """
    target = check_output_path(output, PICTURE_EXTENSIONS)
    if kind not in PLOT_KINDS:
        raise OptionError(f"unknown plot kind {kind!r}: choose one of {', '.join(PLOT_KINDS)}{did_you_mean(kind, PLOT_KINDS)}")
    if kind == "training":  # a run's folder, not a sentence: viz.training_plot draws it
        raise OptionError("--kind training draws a training run: give its folder with --training DIR")
    if mask is not None and kind != "mask":
        raise OptionError("--mask applies to --kind mask")
    if tile is not None and kind != "mask":
        raise OptionError("--tile applies to --kind mask")
    if fixed_scale and kind != "heatmap":
        raise OptionError("--fixed-scale applies to --kind heatmap")
    if tile is not None and tile < 1:
        raise OptionError(f"--tile must be a whole number >= 1, got {tile}")
    if config.model is not None:
        if mask is not None:
            check_spec(mask)  # the model's tokens, and so the numbers' range, are known once it has run
        return target
    if kind == "positional":
        check_positional_picture(config, dim)
    elif kind == "rope-distance":
        check_rope_distance(config, layer, head)
    else:
        tokens, _ = check_toy_inputs(config)
        check_shown_head(layer, head, 1, config.query_heads)  # the toy variants have one layer
        if mask is not None:
            check_spec(mask, len(tokens))
    return target


def check_view_options(config: ExplainConfig, output, *, layer: int = 0, head: int = 0) -> Path:
    """``view``'s checks that need no model: the page's path, and with the toy variants the inputs, layer and head."""
    target = check_output_path(output, PAGE_EXTENSIONS)
    if config.model is None:
        check_toy_inputs(config)
        check_shown_head(layer, head, 1, config.query_heads)
    return target


def positional_picture_name(config: ExplainConfig) -> str:
    """The encoding ``plot --kind positional`` draws for the toy variants: sinusoidal unless --positional names another."""
    return "sinusoidal" if config.positional == "none" else config.positional


def check_positional_picture(config: ExplainConfig, dim: int | None, width: int = 64) -> None:
    """``--kind positional`` draws sinusoidal or rope (at an even width: --dim, default ``width``)."""
    name = positional_picture_name(config)
    if name == "sinusoidal":
        return
    if name != "rope":
        raise OptionError(f"--kind positional draws sinusoidal or rope encodings, not {name}")
    if (dim or width) % 2:
        raise OptionError(f"RoPE turns pairs of features, so --dim must be even, got {dim or width}")


def rope_distance_config(config: ExplainConfig) -> ExplainConfig:
    """The config ``--kind rope-distance`` traces: RoPE with projections (so d_k is even), none without.

    Raises:
        OptionError: a pretrained model, or a positional encoding other than none, rope or sinusoidal.
    """
    if config.model is not None:
        raise OptionError("--kind rope-distance draws the toy variants' vectors; it does not take --model")
    if config.positional not in ("none", "rope", "sinusoidal"):
        raise OptionError(f"--kind rope-distance compares rope with sinusoidal; --positional {config.positional} does not apply")
    return dataclasses.replace(config, positional="rope" if config.variant in PROJECTED else "none")


def check_rope_distance(config: ExplainConfig, layer: int, head: int) -> None:
    """``--kind rope-distance`` with the toy variants: its trace's inputs, layer and head, and 2 features or more."""
    traced = rope_distance_config(config)
    check_toy_inputs(traced)
    check_shown_head(layer, head, 1, traced.query_heads)
    width = embedding_width(config.embed, config.embeddings, config.dim)
    if config.variant not in PROJECTED and width is not None and width < 2:
        raise OptionError("--kind rope-distance turns pairs of features: the embeddings need at least 2 (give --dim 2 or more)")


def check_block_map_options(output, *, length: int, tile: int | None = None, mask: str | None = None,
                            mask_mod: str | None = None) -> tuple[Path, int]:
    """``plot --kind mask --length N``'s checks before the mask is built.

    Returns:
        (the picture's path, the block size).

    Raises:
        OutputError: as ``check_plot_options``.
        OptionError: neither or both of a spec and a mask_mod, a length or tile out of
            range, more than MAX_BLOCKS blocks a side, a spec that does not fit the length,
            or a --mask-mod that names no Python file.
    """
    target = check_output_path(output, PICTURE_EXTENSIONS)
    block = BLOCK_MAP_TILE if tile is None else tile
    if (mask is None) == (mask_mod is None):
        raise OptionError("--length draws the block map of one mask: give --mask SPEC or --mask-mod FILE.py:NAME"
                          if mask is None else "give --mask or --mask-mod, not both")
    if isinstance(length, bool) or not isinstance(length, int) or not 1 <= length <= MAX_LENGTH:
        raise OptionError(f"--length must be a whole number from 1 to {MAX_LENGTH}, got {length}")
    if block < 1:
        raise OptionError(f"--tile must be a whole number >= 1, got {block}")
    check_blocks(length, block)
    if mask_mod is not None:
        if length > MAX_MASK_MOD_LENGTH:
            raise OptionError(f"--mask-mod evaluates the mask_mod at every pair: --length is at most "
                              f"{MAX_MASK_MOD_LENGTH} with it, got {length}")
        mask_mod_file(mask_mod)
    else:
        check_spec(mask, length, over="length")
        check_blocks(spec_keys(mask, length), block)  # causal-bottom-right adds its cached keys
    return target, block


def check_blocks(positions: int, block: int) -> None:
    """OptionError when ``positions`` in blocks of ``block`` make more than MAX_BLOCKS blocks a side."""
    blocks = -(-positions // block)
    if blocks > MAX_BLOCKS:
        raise OptionError(f"{positions} positions in blocks of {block} make {blocks} blocks per axis, more than the "
                          f"{MAX_BLOCKS} a picture shows: give a larger --tile")


def mask_mod_file(where: str) -> tuple[Path, str]:
    """(the Python file, the function's name) of --mask-mod FILE.py:NAME, if the file is there."""
    path_text, colon, name = where.rpartition(":")
    if not colon or not path_text or not name:
        raise OptionError(f"--mask-mod {where!r}: give a Python file and a function in it, as FILE.py:NAME")
    path = Path(path_text)
    if path.suffix != ".py":
        raise OptionError(f"--mask-mod {where!r}: {path} is not a Python file (.py)")
    if not path.is_file():
        raise OptionError(f"--mask-mod {where!r}: there is no file {path}")
    return path, name


def run_folder(folder) -> Path:
    """The folder of a training run: ``folder``, or the records of a model selfattn ships (tiny-induction ...).

    Raises:
        TrainingError: there is no such folder, or it is a file.
    """
    path = Path(folder)
    if not path.exists() and str(folder) in SHIPPED:  # a model selfattn ships keeps its run's records
        path = model_folder(str(folder))
    if not path.exists():
        raise TrainingError(f"there is no training run at {folder}: the folder does not exist")
    if not path.is_dir():
        raise TrainingError(f"{folder} is a file, not a training run's folder")
    return path


def check_training_picture(folder, output, extensions: tuple[str, ...]) -> Path:
    """``plot --training`` and ``view --training``: the output's path (with ``extensions``), then the run's folder."""
    target = check_output_path(output, extensions)
    run_folder(folder)
    return target
