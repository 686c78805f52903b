"""A model pulled with ollama, found in its local store from the name alone: no torch, never the network.

``ollama:NAME[:TAG]`` names a model the way ``ollama run`` does. The store (ollama's
``envconfig.Models``, ``manifest/paths.go`` and ``types/model/name.go``) is laid out so:

- its root is ``$OLLAMA_MODELS``, else ``~/.ollama/models``;
- a name has up to three ``/``-separated parts, ``[[host/]namespace/]model``, and a tag
  after a ``:`` that comes after the last ``/`` (a host may carry a port, ``host:5000``).
  Missing parts default to host ``registry.ollama.ai``, namespace ``library`` and tag
  ``latest``;
- the manifest of a name is the JSON file ``manifests/<host>/<namespace>/<model>/<tag>``;
  its ``layers`` list holds one layer of media type ``application/vnd.ollama.image.model``,
  the GGUF weights, named by a digest ``sha256:<hex>``;
- that layer's bytes are the file ``blobs/sha256-<hex>``. Stores written before ollama
  0.1.29 (March 2024) named it ``blobs/sha256:<hex>`` outside Windows, and ollama renames
  those when its server starts; a store it has not yet renamed is read as it is.

``ollama_blob`` applies these rules, and the command line calls it before torch loads, so
a model that is not there is one line at once. Reading the GGUF file is done elsewhere.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from selfattn.errors import ModelError, did_you_mean
from selfattn.models.gguf_layout import MAGIC as GGUF_MAGIC

PREFIX = "ollama:"

DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"
MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"

# ollama's own rules for each part of a name: a letter, digit or "_" first, then a few
# punctuation marks; a namespace has no ".", and only a host may hold ":" (its port).
_PART = {
    "host": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:\-]{0,349}"),
    "namespace": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_\-]{0,79}"),
    "model": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,79}"),
    "tag": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,79}"),
}
_DIGEST = re.compile(r"sha256[:-]([0-9a-fA-F]{64})")
FORM = "ollama:NAME[:TAG] (NAME is model, namespace/model or host/namespace/model)"


def is_ollama(name) -> bool:
    """Whether ``name`` is a string naming an ollama model, ``"ollama:..."``."""
    return isinstance(name, str) and name.startswith(PREFIX)


def store_root() -> Path:
    """The root of ollama's model store: ``$OLLAMA_MODELS``, else ``~/.ollama/models``.

    As ollama reads the variable: surrounding spaces and quotes are dropped, and an
    empty value means unset.
    """
    configured = os.environ.get("OLLAMA_MODELS", "").strip().strip("\"'")
    if configured:
        return Path(configured).expanduser().absolute()
    return (Path.home() / ".ollama" / "models").absolute()


def ollama_blob(spec: str) -> Path:
    """The GGUF file of an ollama model: the blob of its manifest's model layer.

    Args:
        spec: ``"ollama:NAME[:TAG]"``, for example ``"ollama:llama3.2"``,
            ``"ollama:llama3.2:1b"``, ``"ollama:someone/tiny:q4"`` or
            ``"ollama:localhost:5000/ns/tiny:latest"``.

    Returns:
        The absolute path of the blob, checked to start with the GGUF magic bytes.

    Raises:
        ModelError: the spec is malformed, the store or the manifest is missing (the
            message names the tags the store has for that model, if any), the manifest
            is not JSON or has no model layer, or the blob is missing or not a GGUF file.
    """
    host, namespace, model, tag = parse_spec(spec)
    shown = f"{PREFIX}{_short_name(host, namespace, model)}:{tag}"
    root = store_root()
    if not root.is_dir():
        raise ModelError(
            f"cannot find {shown}: the ollama model store {root} does not exist "
            "(set OLLAMA_MODELS to the folder ollama keeps its models in, or pull the model with ollama)"
        )
    manifest_path = root / "manifests" / host / namespace / model / tag
    if not manifest_path.is_file():
        raise ModelError(f"cannot find {shown}: no manifest {manifest_path}; {_what_is_there(root, host, namespace, model)}")
    digest = _model_layer_digest(manifest_path, shown)
    return _checked_blob(root, digest, shown)


def parse_spec(spec: str) -> tuple[str, str, str, str]:
    """``"ollama:NAME[:TAG]"`` as its four parts ``(host, namespace, model, tag)``, defaults filled in.

    Raises:
        ModelError: ``spec`` is not such a string, a part is empty or holds a character
            ollama does not allow there, or it has more than three ``/``-separated parts.
    """
    if not is_ollama(spec):
        raise ModelError(f"an ollama model is named {FORM}, got {spec!r}")
    text = spec[len(PREFIX):]
    if not text.strip():
        raise ModelError(f"the ollama model name is empty in {spec!r}; name it as {FORM}")
    name, tag = text, DEFAULT_TAG
    if text.rfind(":") > text.rfind("/"):  # a ":" before the last "/" belongs to the host's port
        name, _, tag = text.rpartition(":")
    parts = name.split("/")
    if len(parts) > 3:
        raise ModelError(f"the ollama model name {spec!r} has {len(parts)} '/'-separated parts, at most 3; name it as {FORM}")
    defaults = [DEFAULT_HOST, DEFAULT_NAMESPACE][: 3 - len(parts)]
    host, namespace, model = defaults + parts
    for kind, value in (("host", host), ("namespace", namespace), ("model", model), ("tag", tag)):
        if not _PART[kind].fullmatch(value):
            raise ModelError(f"the ollama model name {spec!r} has a bad {kind} {value!r}: {_rule(kind)}")
    return host, namespace, model, tag


def _rule(kind: str) -> str:
    """In words, what ollama allows in one part of a name."""
    marks = {"host": "'.', ':', '-' and '_'", "namespace": "'-' and '_'"}.get(kind, "'.', '-' and '_'")
    most = 350 if kind == "host" else 80
    return f"it must be 1 to {most} letters, digits, {marks}, starting with a letter, digit or '_'"


def _short_name(host: str, namespace: str, model: str) -> str:
    """The name as ollama prints it: without the default host and namespace."""
    if host != DEFAULT_HOST:
        return f"{host}/{namespace}/{model}"
    if namespace != DEFAULT_NAMESPACE:
        return f"{namespace}/{model}"
    return model


def _what_is_there(root: Path, host: str, namespace: str, model: str) -> str:
    """The end of a missing-manifest message: the tags the store has for the model, or close names."""
    model_dir = root / "manifests" / host / namespace / model
    tags = sorted(p.name for p in _entries(model_dir) if p.is_file())
    short = _short_name(host, namespace, model)
    if tags:
        return "ollama has " + ", ".join(f"{short}:{t}" for t in tags)
    models = [p.name for p in _entries(model_dir.parent) if p.is_dir()]
    return f"ollama has no model {short}{did_you_mean(model, models)} (pull it with: ollama pull {short})"


def _entries(folder: Path) -> list[Path]:
    """The entries of a folder, or none when it is missing or unreadable."""
    try:
        return list(folder.iterdir())
    except OSError:
        return []


def _model_layer_digest(manifest_path: Path, shown: str) -> str:
    """The hex digest of the manifest's model layer (the GGUF weights)."""
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        reason = " ".join(str(err).split())
        raise ModelError(f"cannot read {shown}: its manifest {manifest_path} is not JSON ({reason})") from None
    layers = manifest.get("layers") if isinstance(manifest, dict) else None
    if not isinstance(layers, list):
        raise ModelError(f"cannot read {shown}: its manifest {manifest_path} has no list of layers")
    for layer in layers:
        if isinstance(layer, dict) and layer.get("mediaType") == MODEL_MEDIA_TYPE:
            digest = layer.get("digest")
            found = _DIGEST.fullmatch(digest) if isinstance(digest, str) else None
            if found is None:
                raise ModelError(
                    f"cannot read {shown}: the model layer in its manifest {manifest_path} "
                    f"has digest {digest!r}, not 'sha256:' and 64 hex digits"
                )
            return found.group(1)
    raise ModelError(f"cannot read {shown}: its manifest {manifest_path} has no model layer (media type {MODEL_MEDIA_TYPE})")


def _checked_blob(root: Path, digest: str, shown: str) -> Path:
    """The blob of a digest, in today's name or the older one, checked to be a GGUF file."""
    blobs = root / "blobs"
    candidates = [blobs / f"sha256-{digest}", blobs / f"sha256:{digest}"]
    blob = next((p for p in candidates if p.is_file()), None)
    if blob is None:
        raise ModelError(
            f"cannot read {shown}: its manifest names blob sha256:{digest}, but {candidates[0]} is missing "
            "(the store is incomplete: pull the model again with ollama)"
        )
    try:
        with blob.open("rb") as f:
            magic = f.read(len(GGUF_MAGIC))
    except OSError as err:
        raise ModelError(f"cannot read {shown}: cannot open its blob {blob} ({err.strerror or err})") from None
    if magic != GGUF_MAGIC:
        raise ModelError(f"cannot read {shown}: its blob {blob} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r})")
    return blob
