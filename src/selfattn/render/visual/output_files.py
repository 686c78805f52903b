"""Writing output files safely: check the path before any work, never leave a partial file.

A picture or page is written to a temporary file next to the target and moved into
place in one step (os.replace), so a failure halfway leaves the old file, or nothing.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

from selfattn.errors import OutputError

PICTURE_EXTENSIONS = (".png", ".svg")  # what matplotlib writes for us (plots.save_figure)
PAGE_EXTENSIONS = (".html", ".htm")  # the explorer's and the training replay's pages


def check_output_path(path: str | os.PathLike, extensions: tuple[str, ...]) -> Path:
    """The path as a Path, if its extension is one of ``extensions`` and its folder is writable."""
    target = Path(path)
    wanted = " or ".join(extensions)
    if target.is_dir() or str(path).endswith(os.sep):
        raise OutputError(f"cannot write {path}: it is a folder; name a file in it, such as {target / ('attention' + extensions[0])}")
    suffix = target.suffix.lower()
    if suffix not in extensions:
        shown = f"'{target.suffix}'" if target.suffix else "no extension"
        raise OutputError(f"unsupported output extension {shown} for {target}: use {wanted}")
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise OutputError(f"cannot write {target}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write {target}: no permission to write in {folder}")
    return target


def write_atomically(target: Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(temporary_path)``, then move the result onto ``target`` in one step."""
    try:
        handle = tempfile.NamedTemporaryFile(dir=target.parent, prefix=f".{target.name}.", suffix=target.suffix, delete=False)
    except OSError as error:
        raise OutputError(f"cannot write {target}: {error.strerror or error}") from None
    handle.close()
    temporary = Path(handle.name)
    try:
        write(temporary)
        # A temporary file is private (0600); give the result the mode a plain write would.
        os.chmod(temporary, target.stat().st_mode & 0o777 if target.exists() else 0o666 & ~_umask())
        os.replace(temporary, target)
    except OSError as error:
        raise OutputError(f"cannot write {target}: {error.strerror or error}") from None
    finally:
        temporary.unlink(missing_ok=True)
    return target


def write_text(target: Path, text: str) -> Path:
    """Write ``text`` as UTF-8 to ``target``, atomically."""
    return write_atomically(target, lambda temporary: temporary.write_text(text, encoding="utf-8"))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
