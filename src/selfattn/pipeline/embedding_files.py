"""Load a user's embedding table from a file (``selfattn explain ... --embeddings FILE``).

A table has one of two shapes:

* a matrix ``(n, d)``: row i embeds the i-th token of the sentence;
* a mapping ``token -> vector (d,)``: looked up by token text, so its order does not matter.

The file extension, in any case, picks the reader:

``.json``         an object ``{"token": [numbers], ...}`` (mapping) or an array of arrays
                  (matrix). Only JSON numbers count: ``true`` or ``"1.5"`` is refused.
``.csv``          a matrix, one row per line, comma separated. Spaces around a value and
                  blank lines are fine; a header row is not.
``.npy``          a 2-D numeric array, read without pickle.
``.pt``/``.pth``  a 2-D tensor, or a dict ``str -> 1-D tensor``, read with
                  ``weights_only=True`` so no arbitrary object is ever unpickled.
``.safetensors``  a single 2-D tensor, a 2-D tensor named ``embeddings``, or only 1-D
                  tensors, one per token (the format does not keep the order of saving).

Whatever the format, the result is float32 and finite, and every vector has the same
non-zero length. Integer and float64 values are converted; bool and complex values are
refused, and so is a value too large for float32. Whether the table fits the sentence
(row count, missing tokens) is the caller's check. Each problem raises
:class:`EmbeddingError` with a one-line message that starts with the file's name.
"""

import csv
import functools
import io
import json
import math
import os
from collections.abc import Callable

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors

from selfattn.errors import EmbeddingError
from selfattn.pipeline.embedding_options import EMBEDDING_EXTENSIONS, check_embedding_path

Table = torch.Tensor | dict[str, torch.Tensor]


def load_embedding_file(path: str | os.PathLike) -> torch.Tensor | dict[str, torch.Tensor]:
    """Read an embedding table: a matrix (n, d) with one row per token, or a mapping token -> vector (d,).

    The extension, in any case, picks the reader: .json, .csv, .npy, .pt/.pth or
    .safetensors (the module docstring says what each may hold). Nothing is unpickled.
    Whether the table fits a sentence (row count, missing tokens) is left to ``embed``.

    Args:
        path: the file to read.

    Returns:
        A float32 matrix (n, d), row i for the sentence's i-th token; or a dict
        token -> float32 vector (d,). Every value is finite and d >= 1 is the same for
        every vector.

    Raises:
        EmbeddingError: the file is missing, a folder, unreadable or empty; its extension
            is not supported; or its content is damaged, not a table of real numbers,
            ragged, empty, or holds a value that is not finite in float32. The message
            starts with the file's name.
    """
    where = f"embeddings file {os.fspath(path)!r}"
    file = check_embedding_path(path)  # it exists, is a file, and a reader knows its extension
    try:
        # One read, then parse from memory: every reader sees the same bytes and disk
        # errors are handled here only.
        data = file.read_bytes()
    except PermissionError as err:
        raise EmbeddingError(f"{where}: cannot be read (permission denied)") from err
    except OSError as err:
        raise EmbeddingError(f"{where}: cannot be read ({err.strerror or _first_line(err)})") from err
    if not data:
        raise EmbeddingError(f"{where}: is empty")
    return _READERS[file.suffix.lower()](data, where)


# --- readers: bytes -> table ---------------------------------------------------------


def _read_json(data: bytes, where: str) -> Table:
    hook = functools.partial(_json_object, where=where)
    try:
        top = json.loads(_decode_text(data, where), object_pairs_hook=hook)
    except json.JSONDecodeError as err:
        raise EmbeddingError(f"{where}: is not valid JSON: {err.msg} (line {err.lineno}, column {err.colno})") from err
    except RecursionError as err:
        raise EmbeddingError(f"{where}: is not valid JSON: nested too deeply") from err
    if isinstance(top, dict):
        if not top:
            raise EmbeddingError(f"{where}: the JSON object is empty; expected at least one token")
        labels = [f"token {token!r}" for token in top]
        rows = [_json_vector(value, label, where) for value, label in zip(top.values(), labels)]
        return dict(zip(top, _rows_to_matrix(rows, labels, where).unbind(0)))
    if isinstance(top, list):
        labels = [f"row {i}" for i in range(1, len(top) + 1)]
        rows = [_json_vector(value, label, where) for value, label in zip(top, labels)]
        return _rows_to_matrix(rows, labels, where)
    raise EmbeddingError(
        f"{where}: top level is {_JSON_KINDS[type(top)]}; expected an object "
        "(token -> list of numbers) or an array of rows"
    )


def _read_csv(data: bytes, where: str) -> torch.Tensor:
    # strict: an unclosed quote is an error, not a field that swallows the rest of the file
    reader = csv.reader(io.StringIO(_decode_text(data, where), newline=""), strict=True)
    rows, labels = [], []
    try:
        for record in reader:
            if len(record) <= 1 and not "".join(record).strip():
                continue
            label = f"line {reader.line_num}"
            rows.append([_csv_number(field, label, col, where) for col, field in enumerate(record, 1)])
            labels.append(label)
    except csv.Error as err:
        raise EmbeddingError(f"{where}: is not valid CSV at line {reader.line_num}: {err}") from err
    return _rows_to_matrix(rows, labels, where)


def _read_npy(data: bytes, where: str) -> torch.Tensor:
    # Without its magic string numpy takes a file for a pickle and says so; a wrong
    # extension deserves a plainer message.
    if not data.startswith(b"\x93NUMPY"):
        raise EmbeddingError(f"{where}: is not a .npy file (no NUMPY header at the start)")
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except Exception as err:
        # A damaged header fails inside numpy's header parser with many exception types,
        # and a refused object array is a ValueError like any other damage.
        if isinstance(err, ValueError) and "allow_pickle" in str(err):
            raise EmbeddingError(
                f"{where}: holds Python objects; only plain numeric arrays are loaded, never pickles"
            ) from err
        raise EmbeddingError(f"{where}: is damaged or truncated ({_first_line(err)})") from err
    if array.dtype.kind not in "biufc":
        raise EmbeddingError(f"{where}: holds {array.dtype} values; expected numbers")
    # torch reads neither foreign byte order nor every integer width, and float64 holds any
    # value float32 can; bool and complex keep their dtype so the shared check refuses them.
    wanted = np.float64 if array.dtype.kind in "iuf" else array.dtype.newbyteorder("=")
    return _checked_matrix(torch.from_numpy(array.astype(wanted)), where)


def _read_torch(data: bytes, where: str) -> Table:
    try:
        loaded = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as err:
        # torch.load reports damage with whatever its zip reader or unpickler raises, so no
        # narrower class covers it; weights_only has already refused any foreign object.
        raise EmbeddingError(
            f"{where}: cannot be loaded with torch.load(weights_only=True): it is damaged, "
            f"not a torch.save file, or holds objects other than tensors ({type(err).__name__})"
        ) from err
    if isinstance(loaded, torch.Tensor):
        return _checked_matrix(loaded, where)
    if isinstance(loaded, dict):
        return _tensor_mapping(loaded, where)
    kind = type(loaded).__name__
    raise EmbeddingError(f"{where}: holds a {kind}; expected a 2-D tensor or a dict of token -> 1-D tensor")


def _read_safetensors(data: bytes, where: str) -> Table:
    try:
        tensors = load_safetensors(data)
    except SafetensorError as err:
        raise EmbeddingError(f"{where}: is not a valid safetensors file ({_first_line(err)})") from err
    if not tensors:
        raise EmbeddingError(f"{where}: holds no tensors")
    if len(tensors) == 1:
        (only,) = tensors.values()
        if only.dim() != 1:
            return _checked_matrix(only, where)
    if "embeddings" in tensors and tensors["embeddings"].dim() == 2:
        return _checked_matrix(tensors["embeddings"], where)
    if all(tensor.dim() == 1 for tensor in tensors.values()):
        return _tensor_mapping(tensors, where)
    shapes = ", ".join(f"{name!r} {tuple(t.shape)}" for name, t in sorted(tensors.items())[:5])
    more = ", ..." if len(tensors) > 5 else ""
    raise EmbeddingError(
        f"{where}: holds tensors {shapes}{more}; expected one 2-D tensor, a 2-D tensor "
        "named 'embeddings', or only 1-D tensors (one per token)"
    )


# --- JSON and CSV values -------------------------------------------------------------

_JSON_KINDS = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
               type(None): "null", int: "a number", float: "a number"}


def _json_object(pairs: list[tuple[str, object]], where: str) -> dict[str, object]:
    # json.loads keeps the last of two equal keys; two vectors for one token is a mistake
    mapping: dict[str, object] = {}
    for key, value in pairs:
        if key in mapping:
            raise EmbeddingError(f"{where}: token {key!r} appears twice in the JSON object")
        mapping[key] = value
    return mapping


def _json_vector(value: object, label: str, where: str) -> list[float]:
    if not isinstance(value, list):
        raise EmbeddingError(f"{where}: {label} is {_JSON_KINDS[type(value)]}, expected a list of numbers")
    return [_json_number(item, f"{label}, value {i}", where) for i, item in enumerate(value, 1)]


def _json_number(item: object, label: str, where: str) -> float:
    # bool is an int in Python, but true/false in a table is a slip, not 1/0
    if isinstance(item, bool) or not isinstance(item, (int, float)):
        shown = json.dumps(item)
        shown = shown if len(shown) <= 20 else shown[:17] + "..."
        raise EmbeddingError(f"{where}: {label} is {_JSON_KINDS[type(item)]} ({shown}), expected a JSON number")
    try:
        return float(item)
    except OverflowError as err:  # an integer literal beyond even float64
        raise EmbeddingError(f"{where}: {label} does not fit in float32") from err


def _csv_number(field: str, label: str, column: int, where: str) -> float:
    text = field.strip()
    try:
        return float(text)
    except ValueError as err:
        problem = "is empty" if not text else f"{text!r} is not a number"
        raise EmbeddingError(
            f"{where}: {label}, column {column}: {problem} (CSV holds numbers only, no header)"
        ) from err


def _decode_text(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8-sig")  # spreadsheet programs often write a BOM
    except UnicodeDecodeError as err:
        raise EmbeddingError(f"{where}: is not UTF-8 text (bad byte at offset {err.start})") from err


# --- shared checks -------------------------------------------------------------------


def _rows_to_matrix(rows: list[list[float]], labels: list[str], where: str) -> torch.Tensor:
    """Rows of Python floats -> finite float32 matrix (n, d); labels name each row in errors."""
    _check_lengths(rows, labels, where)
    return _checked_matrix(torch.tensor(rows, dtype=torch.float64), where, labels)


def _tensor_mapping(tensors: dict, where: str) -> dict[str, torch.Tensor]:
    """token -> 1-D tensor of any real dtype  ->  token -> finite float32 vector (d,)."""
    if not tensors:
        raise EmbeddingError(f"{where}: holds an empty mapping; expected at least one token")
    for token, vector in tensors.items():
        if not isinstance(token, str):
            raise EmbeddingError(f"{where}: mapping key {token!r} is not a string (keys are tokens)")
        if not isinstance(vector, torch.Tensor) or vector.dim() != 1:
            shown = f"shape {tuple(vector.shape)}" if isinstance(vector, torch.Tensor) else type(vector).__name__
            raise EmbeddingError(f"{where}: token {token!r} holds a {shown}; expected a 1-D tensor")
        _check_real_dtype(vector, where, f"token {token!r} ")
    labels = [f"token {token!r}" for token in tensors]
    _check_lengths(list(tensors.values()), labels, where)
    stacked = torch.stack([vector.detach().to(torch.float64) for vector in tensors.values()])  # (n, d)
    return dict(zip(tensors, _checked_matrix(stacked, where, labels).unbind(0)))


def _check_lengths(rows: list, labels: list[str], where: str) -> None:
    if not rows:
        raise EmbeddingError(f"{where}: has no rows; expected at least one embedding")
    width = len(rows[0])
    if width == 0:
        raise EmbeddingError(f"{where}: {labels[0]} is empty; an embedding needs at least one value")
    for row, label in zip(rows, labels):
        if len(row) != width:
            raise EmbeddingError(
                f"{where}: {label} has {len(row)} values, expected {width} "
                "(all embeddings must have the same length)"
            )


def _check_real_dtype(tensor: torch.Tensor, where: str, label: str = "") -> None:
    if tensor.dtype == torch.bool or tensor.dtype.is_complex:
        dtype = str(tensor.dtype).removeprefix("torch.")
        raise EmbeddingError(f"{where}: {label}holds {dtype} values; expected real numbers (int or float)")


def _checked_matrix(tensor: torch.Tensor, where: str, labels: list[str] | None = None) -> torch.Tensor:
    """Any tensor -> (n, d) float32 with n, d > 0 and every value finite, or EmbeddingError."""
    if tensor.dim() != 2:
        raise EmbeddingError(
            f"{where}: holds a {tensor.dim()}-D array of shape {tuple(tensor.shape)}; "
            "expected a 2-D matrix (one row per token)"
        )
    if 0 in tensor.shape:
        shape = tuple(tensor.shape)
        raise EmbeddingError(f"{where}: matrix has shape {shape}; it needs at least one row and one column")
    _check_real_dtype(tensor, where)
    original = tensor.detach()
    matrix = original.to(torch.float32)  # (n, d)
    bad = (~torch.isfinite(matrix)).nonzero()  # (k, 2) indices of bad entries
    if len(bad):
        row, column = bad[0].tolist()
        label = labels[row] if labels else f"row {row + 1}"
        value = original[row, column].item()
        if math.isfinite(value):  # finite as written, infinite once narrowed
            raise EmbeddingError(
                f"{where}: {label}, value {column + 1} ({value:g}) does not fit in float32 "
                "(largest magnitude is about 3.4e38)"
            )
        raise EmbeddingError(f"{where}: {label}, value {column + 1} is {value}; embeddings must be finite")
    return matrix


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


_READERS: dict[str, Callable[[bytes, str], Table]] = {
    ".json": _read_json,
    ".csv": _read_csv,
    ".npy": _read_npy,
    ".pt": _read_torch,
    ".pth": _read_torch,
    ".safetensors": _read_safetensors,
}
assert tuple(_READERS) == EMBEDDING_EXTENSIONS, "each extension the options accept has its reader"
