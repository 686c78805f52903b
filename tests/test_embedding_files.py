"""Loading embedding tables from files: each format's own writer, then every way to get it wrong.

Round trips write with the format's writer (json, csv, numpy, torch, safetensors), never with
our loader, and compare the values read back with the values written.
"""

import csv
import json
import math
import pathlib
import re
import tempfile

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from selfattn.errors import EmbeddingError
from selfattn.pipeline.embedding_files import load_embedding_file

MATRIX = [[0.5, -1.25, 3.0], [2.0, 0.0, -0.75], [1e-3, 4.5, -2.0]]
MAPPING = {"the": [0.5, -1.25, 3.0], "cat": [2.0, 0.0, -0.75], "sat": [1e-3, 4.5, -2.0]}


def expected(rows):
    return torch.tensor(rows, dtype=torch.float32)


def assert_mapping(loaded, mapping):
    assert isinstance(loaded, dict)
    assert sorted(loaded) == sorted(mapping)
    for token, vector in mapping.items():
        assert loaded[token].dtype == torch.float32
        torch.testing.assert_close(loaded[token], torch.tensor(vector, dtype=torch.float32), rtol=0, atol=0)


def assert_matrix(loaded, rows):
    assert isinstance(loaded, torch.Tensor)
    assert loaded.dtype == torch.float32
    torch.testing.assert_close(loaded, expected(rows), rtol=0, atol=0)


def assert_refused(path, pattern):
    """Load must fail with one line that names the file and matches ``pattern``."""
    with pytest.raises(EmbeddingError, match=pattern) as caught:
        load_embedding_file(path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"embeddings file {str(path)!r}: ")
    return message


def write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f)
    return path


def write_text(path, text):
    path.write_text(text)
    return path


def write_npy(path, array):
    np.save(path, array)
    return path


def write_pt(path, obj):
    torch.save(obj, path)
    return path


def write_safetensors(path, tensors):
    save_file(tensors, path)
    return path


# --- round trips ---------------------------------------------------------------------


def test_embedding_error_is_a_value_error():
    assert issubclass(EmbeddingError, ValueError)


def test_json_matrix_round_trip(tmp_path):
    assert_matrix(load_embedding_file(write_json(tmp_path / "e.json", MATRIX)), MATRIX)


def test_json_mapping_round_trip_keeps_file_order(tmp_path):
    loaded = load_embedding_file(write_json(tmp_path / "e.json", MAPPING))
    assert list(loaded) == ["the", "cat", "sat"]
    assert_mapping(loaded, MAPPING)


def test_json_integers_become_float32(tmp_path):
    assert_matrix(load_embedding_file(write_json(tmp_path / "e.json", [[1, -2], [3, 4]])), [[1, -2], [3, 4]])


def test_extension_is_case_insensitive(tmp_path):
    assert_matrix(load_embedding_file(write_json(tmp_path / "E.JSON", MATRIX)), MATRIX)


def test_csv_round_trip(tmp_path):
    path = tmp_path / "e.csv"
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(MATRIX)
    assert_matrix(load_embedding_file(path), MATRIX)


def test_csv_allows_spaces_blank_lines_and_bom(tmp_path):
    path = tmp_path / "e.csv"
    path.write_bytes("\ufeff 1 , 2\r\n\r\n   \n3,\t4 \n\n".encode())
    assert_matrix(load_embedding_file(path), [[1, 2], [3, 4]])


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int64", "int8", "uint64", ">f8", ">i4"])
def test_npy_round_trip_converts_real_dtypes(tmp_path, dtype):
    rows = [[1, 2, 3], [4, 5, 6]] if dtype.startswith("uint") else [[1, -2, 3], [4, 5, -6]]
    loaded = load_embedding_file(write_npy(tmp_path / "e.npy", np.array(rows, dtype=dtype)))
    assert_matrix(loaded, rows)


def test_npy_float64_round_trip_rounds_to_float32(tmp_path):
    array = np.array([[0.1, 1 / 3], [math.pi, -2e-5]], dtype=np.float64)
    loaded = load_embedding_file(write_npy(tmp_path / "e.npy", array))
    assert loaded.dtype == torch.float32
    torch.testing.assert_close(loaded, torch.from_numpy(array.astype(np.float32)), rtol=0, atol=0)


@pytest.mark.parametrize("suffix", [".pt", ".pth"])
def test_pt_matrix_round_trip(tmp_path, suffix):
    path = write_pt(tmp_path / f"e{suffix}", torch.tensor(MATRIX, dtype=torch.float64))
    assert_matrix(load_embedding_file(path), MATRIX)


@pytest.mark.parametrize("suffix", [".pt", ".pth"])
def test_pt_mapping_round_trip(tmp_path, suffix):
    tensors = {token: torch.tensor(vector) for token, vector in MAPPING.items()}
    tensors["sat"] = tensors["sat"].to(torch.float64)  # mixed dtypes are fine
    loaded = load_embedding_file(write_pt(tmp_path / f"e{suffix}", tensors))
    assert list(loaded) == ["the", "cat", "sat"]
    assert_mapping(loaded, MAPPING)


def test_pt_parameter_loads_as_plain_tensor(tmp_path):
    path = write_pt(tmp_path / "e.pt", torch.nn.Parameter(torch.tensor(MATRIX)))
    loaded = load_embedding_file(path)
    assert not loaded.requires_grad
    assert_matrix(loaded, MATRIX)


def test_safetensors_single_matrix_round_trip(tmp_path):
    path = write_safetensors(tmp_path / "e.safetensors", {"weight": torch.tensor(MATRIX)})
    assert_matrix(load_embedding_file(path), MATRIX)


def test_safetensors_named_embeddings_round_trip(tmp_path):
    tensors = {"embeddings": torch.tensor(MATRIX, dtype=torch.float64), "other": torch.zeros(2, 2, 2)}
    assert_matrix(load_embedding_file(write_safetensors(tmp_path / "e.safetensors", tensors)), MATRIX)


def test_safetensors_mapping_round_trip(tmp_path):
    tensors = {token: torch.tensor(vector) for token, vector in MAPPING.items()}
    assert_mapping(load_embedding_file(write_safetensors(tmp_path / "e.safetensors", tensors)), MAPPING)


finite_float32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@settings(max_examples=25, deadline=None)
@given(shape=st.tuples(st.integers(1, 4), st.integers(1, 4)), data=st.data())
def test_every_format_reads_back_exactly_what_was_written(shape, data):
    rows = data.draw(st.lists(st.lists(finite_float32, min_size=shape[1], max_size=shape[1]),
                              min_size=shape[0], max_size=shape[0]))
    table = torch.tensor(rows, dtype=torch.float32)
    with tempfile.TemporaryDirectory() as folder:
        folder = pathlib.Path(folder)
        write_json(folder / "e.json", rows)
        with open(folder / "e.csv", "w", newline="") as f:
            csv.writer(f).writerows(rows)
        write_npy(folder / "e.npy", table.numpy())
        write_pt(folder / "e.pt", table)
        write_safetensors(folder / "e.safetensors", {"embeddings": table})
        for name in ["e.json", "e.csv", "e.npy", "e.pt", "e.safetensors"]:
            loaded = load_embedding_file(folder / name)
            assert loaded.dtype == torch.float32, name
            torch.testing.assert_close(loaded, table, rtol=0, atol=0, msg=name)


# --- the file itself -----------------------------------------------------------------


def test_missing_file(tmp_path):
    assert_refused(tmp_path / "nope.json", "no such file")


def test_directory(tmp_path):
    (tmp_path / "table.json").mkdir()
    assert_refused(tmp_path / "table.json", "is a directory")


# CI runs as root, which reads files whatever their mode, so the denial is simulated.
def test_unreadable_file_simulated(tmp_path, monkeypatch):
    path = write_json(tmp_path / "e.json", MATRIX)

    def deny(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(pathlib.Path, "open", deny)
    assert_refused(path, r"cannot be read \(permission denied\)")


@pytest.mark.parametrize("name, shown", [("e.txt", "'.txt'"), ("e.JSONL", "'.JSONL'"), ("embeddings", "(none)")])
def test_unknown_extension_lists_supported_ones(tmp_path, name, shown):
    message = assert_refused(write_text(tmp_path / name, "[[1]]"), "unsupported extension " + re.escape(shown))
    assert message.endswith("supported: .json, .csv, .npy, .pt, .pth, .safetensors")


@pytest.mark.parametrize("suffix", [".json", ".csv", ".npy", ".pt", ".pth", ".safetensors"])
def test_empty_file(tmp_path, suffix):
    path = tmp_path / f"e{suffix}"
    path.write_bytes(b"")
    assert_refused(path, "is empty$")


# --- corrupt content -----------------------------------------------------------------


def test_bad_json_syntax_says_where(tmp_path):
    """Line and column as the json module itself reports them (CPython 3.13 counts the column differently)."""
    text = '{"a": [1, 2,]}'
    with pytest.raises(json.JSONDecodeError) as python:
        json.loads(text)
    where = rf"\(line {python.value.lineno}, column {python.value.colno}\)"
    assert_refused(write_text(tmp_path / "e.json", text), rf"is not valid JSON: {re.escape(python.value.msg)} {where}")


def test_json_nested_too_deeply(tmp_path):
    assert_refused(write_text(tmp_path / "e.json", "[" * 100_000 + "]" * 100_000), "nested too deeply")


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_text_that_is_not_utf8(tmp_path, suffix):
    path = tmp_path / f"e{suffix}"
    path.write_bytes(b"[[1, 2]]\xff" if suffix == ".json" else b"1,2\n\xff,3\n")
    assert_refused(path, r"is not UTF-8 text \(bad byte at offset \d+\)")


def test_csv_unclosed_quote(tmp_path):
    assert_refused(write_text(tmp_path / "e.csv", '1,2\n"3,4\n'), "is not valid CSV at line 2: unexpected end of data")


def test_truncated_npy(tmp_path):
    path = write_npy(tmp_path / "e.npy", np.ones((4, 3)))
    path.write_bytes(path.read_bytes()[:-10])
    assert_refused(path, r"is damaged or truncated \(.*\)")


def test_npy_without_numpy_header(tmp_path):
    assert_refused(write_text(tmp_path / "e.npy", "1,2,3\n"), "is not a .npy file")


@pytest.mark.parametrize("content", [b"garbage" * 20, b"PK\x03\x04" + b"\x00" * 40])
def test_garbage_pt(tmp_path, content):
    path = tmp_path / "e.pt"
    path.write_bytes(content)
    assert_refused(path, re.escape("cannot be loaded with torch.load(weights_only=True)"))


def test_truncated_pt(tmp_path):
    path = write_pt(tmp_path / "e.pt", torch.tensor(MATRIX))
    path.write_bytes(path.read_bytes()[:-100])
    assert_refused(path, re.escape("cannot be loaded with torch.load(weights_only=True)"))


@pytest.mark.parametrize("content", [b"garbage" * 20, b"\x08" + b"\x00" * 7 + b"{}"])
def test_garbage_safetensors(tmp_path, content):
    path = tmp_path / "e.safetensors"
    path.write_bytes(content)
    assert_refused(path, r"is not a valid safetensors file \(.+\)")


# --- the pickle door stays shut -------------------------------------------------------


def write_marker(path):
    pathlib.Path(path).write_text("unpickled!")


class Payload:
    """Unpickling this calls write_marker: proof that the loader ran a pickle."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (write_marker, (str(self.marker),))


def test_pt_with_pickled_object_is_refused_not_run(tmp_path):
    marker = tmp_path / "marker"
    path = write_pt(tmp_path / "e.pt", {"the": Payload(marker)})
    assert_refused(path, "holds objects other than tensors")
    assert not marker.exists()
    torch.load(path, weights_only=False)  # the payload is live: a plain unpickle would run it
    assert marker.read_text() == "unpickled!"


def test_npy_object_array_is_refused(tmp_path):
    array = np.empty((2, 2), dtype=object)
    array[:] = [[1.0, 2.0], [3.0, {"x": 1}]]
    path = tmp_path / "e.npy"
    np.save(path, array, allow_pickle=True)
    assert_refused(path, "holds Python objects; only plain numeric arrays are loaded, never pickles")


# --- JSON structure and values --------------------------------------------------------


@pytest.mark.parametrize("top, kind", [("a string", "a string"), (3.5, "a number"), (None, "null"), (True, "a boolean")])
def test_json_top_level_neither_object_nor_array(tmp_path, top, kind):
    assert_refused(write_json(tmp_path / "e.json", top), f"top level is {kind}; expected an object")


@pytest.mark.parametrize("value, kind", [(1.5, "a number"), ("1,2", "a string"), ({"x": 1}, "an object"), (None, "null")])
def test_json_mapping_value_not_a_list(tmp_path, value, kind):
    assert_refused(write_json(tmp_path / "e.json", {"the": [1, 2], "cat": value}),
            f"token 'cat' is {kind}, expected a list of numbers")


def test_json_matrix_row_not_a_list(tmp_path):
    assert_refused(write_json(tmp_path / "e.json", [[1, 2], 3]), "row 2 is a number, expected a list of numbers")


@pytest.mark.parametrize("table, where", [([[1, True]], "row 1, value 2"), ({"cat": [False, 1]}, "token 'cat', value 1")])
def test_json_booleans_are_not_numbers(tmp_path, table, where):
    assert_refused(write_json(tmp_path / "e.json", table), f"{where} is a boolean \\((true|false)\\), expected a JSON number")


@pytest.mark.parametrize("table, where", [([[1, "2.5"]], "row 1, value 2"), ({"cat": ["1e3"]}, "token 'cat', value 1")])
def test_json_number_strings_are_refused(tmp_path, table, where):
    assert_refused(write_json(tmp_path / "e.json", table), f"{where} is a string \\(.*\\), expected a JSON number")


def test_json_null_value(tmp_path):
    assert_refused(write_json(tmp_path / "e.json", [[1, None]]), r"row 1, value 2 is null \(null\), expected a JSON number")


def test_json_duplicate_token(tmp_path):
    assert_refused(write_text(tmp_path / "e.json", '{"cat": [1], "cat": [2]}'), "token 'cat' appears twice")


# --- shape problems ------------------------------------------------------------------


def test_json_ragged_rows(tmp_path):
    assert_refused(write_json(tmp_path / "e.json", [[1, 2, 3], [4, 5, 6], [7, 8]]),
            re.escape("row 3 has 2 values, expected 3 (all embeddings must have the same length)"))


def test_csv_ragged_rows_name_the_line(tmp_path):
    assert_refused(write_text(tmp_path / "e.csv", "1,2,3\n\n4,5\n"), "line 3 has 2 values, expected 3")


def test_json_mapping_vectors_of_different_lengths(tmp_path):
    assert_refused(write_json(tmp_path / "e.json", {"the": [1, 2], "cat": [1, 2, 3]}), "token 'cat' has 3 values, expected 2")


@pytest.mark.parametrize("write, suffix", [(write_pt, ".pt"), (write_safetensors, ".safetensors")])
def test_tensor_mapping_vectors_of_different_lengths(tmp_path, write, suffix):
    path = write(tmp_path / f"e{suffix}", {"cat": torch.ones(2), "the": torch.ones(3)})
    assert_refused(path, r"token '(cat|the)' has \d values, expected \d")


@pytest.mark.parametrize("shape", [(3,), (2, 3, 4), ()])
@pytest.mark.parametrize("write, suffix", [(write_npy, ".npy"), (write_pt, ".pt")])
def test_array_that_is_not_2d(tmp_path, shape, write, suffix):
    table = torch.ones(shape)
    path = write(tmp_path / f"e{suffix}", table.numpy() if suffix == ".npy" else table)
    assert_refused(path, re.escape(f"holds a {len(shape)}-D array of shape {shape}; expected a 2-D matrix"))


def test_safetensors_single_3d_tensor(tmp_path):
    path = write_safetensors(tmp_path / "e.safetensors", {"weight": torch.ones(2, 3, 4)})
    assert_refused(path, re.escape("holds a 3-D array of shape (2, 3, 4); expected a 2-D matrix"))


def test_safetensors_mix_without_embeddings_name(tmp_path):
    path = write_safetensors(tmp_path / "e.safetensors", {"a": torch.ones(2, 3), "b": torch.ones(3)})
    assert_refused(path, re.escape("holds tensors 'a' (2, 3), 'b' (3,); expected one 2-D tensor, a 2-D tensor named "
                            "'embeddings', or only 1-D tensors (one per token)"))


@pytest.mark.parametrize("shape", [(0, 3), (3, 0)])
@pytest.mark.parametrize("write, suffix", [(write_npy, ".npy"), (write_pt, ".pt")])
def test_zero_rows_or_columns(tmp_path, shape, write, suffix):
    table = torch.ones(shape)
    path = write(tmp_path / f"e{suffix}", table.numpy() if suffix == ".npy" else table)
    assert_refused(path, re.escape(f"matrix has shape {shape}; it needs at least one row and one column"))


def test_json_empty_array(tmp_path):
    assert_refused(write_json(tmp_path / "e.json", []), "has no rows; expected at least one embedding")


def test_json_empty_row(tmp_path):
    assert_refused(write_json(tmp_path / "e.json", [[]]), "row 1 is empty; an embedding needs at least one value")


def test_csv_with_only_blank_lines(tmp_path):
    assert_refused(write_text(tmp_path / "e.csv", "\n  \n\n"), "has no rows")


def test_json_empty_mapping(tmp_path):
    assert_refused(write_json(tmp_path / "e.json", {}), "the JSON object is empty; expected at least one token")


def test_pt_empty_mapping(tmp_path):
    assert_refused(write_pt(tmp_path / "e.pt", {}), "holds an empty mapping; expected at least one token")


def test_safetensors_without_tensors(tmp_path):
    assert_refused(write_safetensors(tmp_path / "e.safetensors", {}), "holds no tensors")


def test_pt_holding_a_list(tmp_path):
    assert_refused(write_pt(tmp_path / "e.pt", [torch.ones(3)]), "holds a list; expected a 2-D tensor or a dict")


def test_pt_mapping_with_non_string_key(tmp_path):
    assert_refused(write_pt(tmp_path / "e.pt", {1: torch.ones(3)}), r"mapping key 1 is not a string \(keys are tokens\)")


@pytest.mark.parametrize("value, shown", [([1.0, 2.0], "a list"), (torch.ones(2, 2), "a shape (2, 2)")])
def test_pt_mapping_value_not_a_vector(tmp_path, value, shown):
    assert_refused(write_pt(tmp_path / "e.pt", {"cat": value}), re.escape(f"token 'cat' holds {shown}; expected a 1-D tensor"))


# --- values --------------------------------------------------------------------------


@pytest.mark.parametrize("text, line, column, problem", [
    ("1,2\n3,abc\n", 2, 2, "'abc' is not a number"),
    ("x,y\n1,2\n", 1, 1, "'x' is not a number"),
    ("1,2\n\n3, \n", 3, 2, "is empty"),
])
def test_csv_non_numeric_field_names_line_and_column(tmp_path, text, line, column, problem):
    assert_refused(write_text(tmp_path / "e.csv", text), re.escape(f"line {line}, column {column}: {problem} (CSV holds numbers only"))


@pytest.mark.parametrize("word", ["nan", "NaN", "inf", "-Infinity"])
def test_csv_non_finite_words_are_refused(tmp_path, word):
    assert_refused(write_text(tmp_path / "e.csv", f"1,2\n3,{word}\n"), "line 2, value 2 is (nan|inf|-inf); embeddings must be finite")


def test_json_nan_literal_is_refused(tmp_path):
    assert_refused(write_text(tmp_path / "e.json", '{"the": [1], "cat": [NaN]}'), "token 'cat', value 1 is nan; embeddings must be finite")


def test_npy_nan_names_the_row(tmp_path):
    array = np.ones((3, 2))
    array[1, 0] = np.nan
    assert_refused(write_npy(tmp_path / "e.npy", array), "row 2, value 1 is nan; embeddings must be finite")


@pytest.mark.parametrize("write, suffix", [(write_pt, ".pt"), (write_safetensors, ".safetensors")])
def test_tensor_mapping_infinity_names_the_token(tmp_path, write, suffix):
    path = write(tmp_path / f"e{suffix}", {"the": torch.ones(2), "cat": torch.tensor([1.0, -math.inf])})
    assert_refused(path, "token 'cat', value 2 is -inf; embeddings must be finite")


def test_npy_string_array(tmp_path):
    assert_refused(write_npy(tmp_path / "e.npy", np.array([["a", "b"]])), "holds <U1 values; expected numbers")


@pytest.mark.parametrize("dtype, name", [(np.bool_, "bool"), (np.complex64, "complex64"), (np.complex128, "complex128")])
def test_npy_bool_and_complex_are_refused(tmp_path, dtype, name):
    assert_refused(write_npy(tmp_path / "e.npy", np.ones((2, 2), dtype=dtype)), f"holds {name} values; expected real numbers")


@pytest.mark.parametrize("dtype, name", [(torch.bool, "bool"), (torch.complex64, "complex64")])
def test_pt_bool_and_complex_are_refused(tmp_path, dtype, name):
    assert_refused(write_pt(tmp_path / "e.pt", torch.ones(2, 2, dtype=dtype)), f"holds {name} values; expected real numbers")
    assert_refused(write_pt(tmp_path / "m.pt", {"cat": torch.ones(2, dtype=dtype)}), f"token 'cat' holds {name} values")


def test_safetensors_bool_is_refused(tmp_path):
    path = write_safetensors(tmp_path / "e.safetensors", {"embeddings": torch.ones(2, 2, dtype=torch.bool)})
    assert_refused(path, "holds bool values; expected real numbers")


@pytest.mark.parametrize("suffix, text", [(".json", "[[1, 1e39]]"), (".csv", "1,-1e39\n"), (".json", "[[1, 1" + "0" * 400 + "]]")])
def test_text_value_too_large_for_float32(tmp_path, suffix, text):
    assert_refused(write_text(tmp_path / f"e{suffix}", text), "row 1, value 2 .*does not fit in float32|line 1, value 2 .*does not fit")


def test_npy_float64_too_large_for_float32(tmp_path):
    array = np.ones((2, 2))
    array[1, 1] = 1e39
    assert_refused(write_npy(tmp_path / "e.npy", array), re.escape("row 2, value 2 (1e+39) does not fit in float32"))
