"""What a model family is to selfattn: one record per config.json model_type.

    config.json -> read_config -> our config -> our model
    checkpoint names + our config -> weight_table -> (rules, ignored) -> ``copy_weights``

Each file in ``models/families/`` defines one ``Family`` as ``FAMILY``; the registry
(``models/registry.py``) finds them. This module imports neither torch nor a family, so
the registry can name the families cheaply.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KINDS = ("encoder", "decoder")


@dataclass(frozen=True)
class Family:
    """One model family: how its config.json and its checkpoint become one of our models.

    Attributes:
        model_type: config.json's model_type; also the name of the family's file.
        kind: "encoder" (sees the whole text, no next-token head) or "decoder" (causal,
            generates).
        description: one line on what the family is, for listings.
        read_config: a parsed config.json -> our config; refuses, naming the field,
            what our blocks do not compute.
        weight_table: (our config, the checkpoint's tensor names) -> (rules, ignored):
            one ``WeightRule`` per used tensor and a predicate for the names that are
            known and unused, as ``copy_weights`` takes them.
        refused: config.json field -> what it asks for that our blocks do not compute
            (a config that switches it on is refused).
        load: (folder, name) -> the model, frozen and in eval mode, for a family that
            loads itself (an encoder must); None: the decoders' shared loader
            (``pretrained.load_decoder``) runs read_config and weight_table.
        gguf: how the family reads GGUF files (a ``gguf_layout.GgufMap``: the
            architecture it takes, its keys and tensors); None: it reads none.
    """

    model_type: str
    kind: str
    description: str
    read_config: Callable[[dict], Any]
    weight_table: Callable[[Any, Collection[str]], tuple[list, Callable[[str], bool]]]
    refused: Mapping[str, str] = field(default_factory=dict, compare=False)
    load: Callable[[Path, str], Any] | None = None
    gguf: Any = None

    def __post_init__(self) -> None:
        # A malformed record is a bug in a family file, caught when the registry imports it.
        if not self.model_type.isidentifier():
            raise ValueError(f"a family's model_type must be a module name, got {self.model_type!r}")
        if self.kind not in KINDS:
            raise ValueError(f"family {self.model_type}: kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.kind == "encoder" and self.load is None:
            raise ValueError(f"family {self.model_type}: an encoder needs its own load (only decoders share one)")
