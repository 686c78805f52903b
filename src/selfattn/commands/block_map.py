"""`selfattn plot --kind mask --length N`: the block map of a mask at a real length.

The mask is a --mask spec (``mask_specs.spec_mask``: a structured mask, its block map in
closed form) or a user's own ``mask_mod(b, h, q_idx, kv_idx)`` loaded from a Python file
(--mask-mod FILE.py:NAME) and swept by ``create_block_mask`` with B and H None. Every
mistake, in the options or in the user's file, is one OptionError line.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from selfattn.commands.plot_options import check_block_map_options, mask_mod_file
from selfattn.errors import OptionError, SelfAttnError
from selfattn.masks.block_mask import BlockMask, create_block_mask
from selfattn.render.visual.block_map_figure import plot_block_mask
from selfattn.render.visual.mask_specs import spec_mask

def plot_block_map(output: str, *, length: int, tile: int | None = None, mask: str | None = None,
                   mask_mod: str | None = None) -> Path:
    """Draw the block map of ``mask`` (a spec) or ``mask_mod`` (FILE.py:NAME) over ``length`` positions."""
    target, block = check_block_map_options(output, length=length, tile=tile, mask=mask, mask_mod=mask_mod)
    if mask_mod is not None:
        structured = mask_mod_block_mask(mask_mod, length, block)
        title = f"mask_mod {mask_mod} over {length} tokens"
    else:
        structured, title = spec_mask(mask, length)
    plot_block_mask(structured, target, block_size=block, q_len=length, title=title)
    return target


def mask_mod_block_mask(where: str, length: int, block: int) -> BlockMask:
    """create_block_mask of the mask_mod NAME in FILE.py (``where`` = FILE.py:NAME), B and H None."""
    function = load_mask_mod(where)
    try:
        return create_block_mask(function, None, None, length, length, BLOCK_SIZE=block)
    except SelfAttnError as error:  # it returned something other than a bool tensor of its tile's shape
        raise OptionError(f"--mask-mod {where!r}: {error}") from None
    except Exception as error:  # the user's own code failed: say where, as one line
        raise OptionError(f"--mask-mod {where!r}: the mask_mod failed: {type(error).__name__}: {error}") from None


def load_mask_mod(where: str):
    """The function NAME of the Python file FILE.py, for ``where`` = FILE.py:NAME (imported with importlib)."""
    path, name = mask_mod_file(where)
    module_name = f"selfattn_mask_mod_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # so that dataclasses and pickling inside the file find it
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        sys.modules.pop(module_name, None)
        raise OptionError(f"--mask-mod {where!r}: importing {path} failed: {type(error).__name__}: {error}") from None
    function = getattr(module, name, None)
    if function is None:
        raise OptionError(f"--mask-mod {where!r}: {path} has no {name}")
    if not callable(function):
        raise OptionError(f"--mask-mod {where!r}: {name} is a {type(function).__name__}, not a function")
    return function
