"""`ollama:NAME[:TAG]` finds the GGUF blob in a local ollama store laid out as ollama writes it.

Each test builds a small store in tmp_path (manifests/<host>/<namespace>/<model>/<tag> and
blobs/sha256-<hex>, as in ollama's manifest/paths.go and types/model/name.go) and points
OLLAMA_MODELS at it. The blobs are a few bytes that start with the GGUF magic: reading the
GGUF file is tested elsewhere.
"""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from selfattn.errors import ModelError
from selfattn.models.ollama import (
    PREFIX,
    is_ollama,
    ollama_blob,
    parse_spec,
    store_root,
)

MODEL = "application/vnd.ollama.image.model"
TEMPLATE = "application/vnd.ollama.image.template"


def add_model(root: Path, host: str, namespace: str, model: str, tag: str, *,
              content: bytes = b"GGUF\x03\x00\x00\x00tiny", blob_name: str = "sha256-{hex}", layers=None) -> Path:
    """Write one model into the store as ollama does; the blob's path (None written when layers is given)."""
    hex_digest = hashlib.sha256(content + tag.encode()).hexdigest()
    blob = root / "blobs" / blob_name.format(hex=hex_digest)
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(content)
    if layers is None:
        layers = [
            {"mediaType": TEMPLATE, "digest": "sha256:" + "0" * 64, "size": 10},
            {"mediaType": MODEL, "digest": f"sha256:{hex_digest}", "size": len(content)},
        ]
    manifest = root / "manifests" / host / namespace / model / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "config": {}, "layers": layers}))
    return blob


@pytest.fixture
def store(tmp_path, monkeypatch) -> Path:
    """An empty ollama store that OLLAMA_MODELS names."""
    root = tmp_path / "models"
    (root / "manifests").mkdir(parents=True)
    (root / "blobs").mkdir()
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    return root


def one_line_error(spec) -> str:
    """The ModelError ollama_blob raises for spec, checked to be one line."""
    with pytest.raises(ModelError) as caught:
        ollama_blob(spec)
    message = str(caught.value)
    assert "\n" not in message and message.strip() == message
    return message


def test_is_ollama_takes_only_strings_with_the_prefix():
    assert PREFIX == "ollama:"
    assert is_ollama("ollama:tiny") and is_ollama("ollama:")
    assert not is_ollama("tiny") and not is_ollama("Ollama:tiny") and not is_ollama(None)
    assert not is_ollama(Path("ollama:tiny"))


@pytest.mark.parametrize("spec, parts", [
    ("ollama:tiny", ("registry.ollama.ai", "library", "tiny", "latest")),
    ("ollama:llama3.2:1b", ("registry.ollama.ai", "library", "llama3.2", "1b")),
    ("ollama:someone/tiny:q4", ("registry.ollama.ai", "someone", "tiny", "q4")),
    ("ollama:hf.co/org/model-GGUF:Q4_K_M", ("hf.co", "org", "model-GGUF", "Q4_K_M")),
    ("ollama:localhost:5000/team/tiny", ("localhost:5000", "team", "tiny", "latest")),
])
def test_a_name_takes_ollamas_defaults(spec, parts):
    assert parse_spec(spec) == parts


def test_a_named_tag_finds_its_blob(store):
    blob = add_model(store, "registry.ollama.ai", "library", "tiny", "latest")
    add_model(store, "registry.ollama.ai", "library", "tiny", "q4", content=b"GGUF other")
    found = ollama_blob("ollama:tiny:latest")
    assert found == blob and found.is_absolute()
    assert found.name.startswith("sha256-")


def test_a_bare_name_means_tag_latest(store):
    blob = add_model(store, "registry.ollama.ai", "library", "tiny", "latest")
    assert ollama_blob("ollama:tiny") == blob


def test_a_namespaced_name(store):
    add_model(store, "registry.ollama.ai", "library", "tiny", "q4", content=b"GGUF library")
    blob = add_model(store, "registry.ollama.ai", "someone", "tiny", "q4")
    assert ollama_blob("ollama:someone/tiny:q4") == blob


@pytest.mark.parametrize("host", ["hf.co", "localhost:5000"])
def test_a_fully_qualified_name(store, host):
    blob = add_model(store, host, "org", "tiny-GGUF", "Q8_0")
    assert ollama_blob(f"ollama:{host}/org/tiny-GGUF:Q8_0") == blob


def test_a_store_from_before_the_blob_rename_still_reads(store):
    blob = add_model(store, "registry.ollama.ai", "library", "tiny", "latest", blob_name="sha256:{hex}")
    assert ollama_blob("ollama:tiny") == blob


def test_without_ollama_models_the_store_is_under_home(tmp_path, monkeypatch):
    monkeypatch.delenv("OLLAMA_MODELS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    root = tmp_path / ".ollama" / "models"
    assert store_root() == root
    blob = add_model(root, "registry.ollama.ai", "library", "tiny", "latest")
    assert ollama_blob("ollama:tiny") == blob


def test_ollama_models_is_read_as_ollama_reads_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OLLAMA_MODELS", f' "{tmp_path / "store"}" ')
    assert store_root() == tmp_path / "store"
    monkeypatch.setenv("OLLAMA_MODELS", "")
    assert store_root() == tmp_path / "home" / ".ollama" / "models"


@pytest.mark.parametrize("spec, words", [
    ("ollama:", "is empty"),
    ("ollama:   ", "is empty"),
    ("ollama:ti ny", "bad model 'ti ny'"),
    ("ollama:tiny:", "bad tag ''"),
    ("ollama:tiny:q/4", "bad namespace 'tiny:q'"),  # a ":" before the last "/" is not a tag's
    ("ollama:.hidden", "bad model '.hidden'"),
    ("ollama:some.one/tiny", "bad namespace 'some.one'"),
    ("ollama:/tiny", "bad namespace ''"),
    ("ollama:a/b/c/d", "4 '/'-separated parts"),
    ("ollama:../../etc/passwd", "4 '/'-separated parts"),
    ("ollama:../x/tiny", "bad host '..'"),
    ("ollama:tiny@sha256:abc", "bad model 'tiny@sha256'"),
    ("tiny", "ollama:NAME[:TAG]"),
    (None, "ollama:NAME[:TAG]"),
])
def test_a_malformed_name_is_one_line(store, spec, words):
    assert words in one_line_error(spec)


def test_a_missing_store_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "nowhere"))
    message = one_line_error("ollama:tiny")
    assert "ollama:tiny:latest" in message and str(tmp_path / "nowhere") in message and "does not exist" in message


def test_a_missing_tag_lists_the_tags_there_are(store):
    add_model(store, "registry.ollama.ai", "library", "tiny", "latest")
    add_model(store, "registry.ollama.ai", "library", "tiny", "q4", content=b"GGUF q4")
    message = one_line_error("ollama:tiny:q8")
    assert "no manifest" in message and str(store / "manifests") in message
    assert message.endswith("ollama has tiny:latest, tiny:q4")


def test_a_missing_model_suggests_a_close_name(store):
    add_model(store, "registry.ollama.ai", "someone", "tiny", "q4")
    message = one_line_error("ollama:someone/tine:q4")
    assert "no model someone/tine" in message and "did you mean 'tiny'" in message
    assert "ollama pull someone/tine" in message


@pytest.mark.parametrize("text, words", [
    ("{not json", "is not JSON"),
    ("[]", "no list of layers"),
    ('{"layers": [{"mediaType": "application/vnd.ollama.image.license", "digest": "sha256:' + "1" * 64 + '"}]}',
     "no model layer"),
    ('{"layers": [{"mediaType": "' + MODEL + '", "digest": "md5:abc"}]}', "has digest 'md5:abc'"),
])
def test_a_bad_manifest_is_one_line(store, text, words):
    manifest = store / "manifests" / "registry.ollama.ai" / "library" / "tiny" / "latest"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(text)
    message = one_line_error("ollama:tiny")
    assert words in message and str(manifest) in message


def test_a_missing_blob_is_named(store):
    blob = add_model(store, "registry.ollama.ai", "library", "tiny", "latest")
    blob.unlink()
    message = one_line_error("ollama:tiny")
    assert str(blob) in message and "missing" in message


def test_a_blob_that_is_not_gguf_is_named(store):
    blob = add_model(store, "registry.ollama.ai", "library", "tiny", "latest", content=b"\x89PNG not a model")
    message = one_line_error("ollama:tiny")
    assert str(blob) in message and "is not a GGUF file" in message


def test_importing_the_module_imports_no_torch():
    code = "import sys, selfattn.models.ollama; assert 'torch' not in sys.modules, 'torch was imported'"
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
