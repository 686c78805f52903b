"""Pretrained models run through our own attention: the family registry, loaders, tokenizers, outputs.

``FAMILIES`` maps config.json's model_type to its ``Family`` (one file per family in
``models/families/``). Names load on first use, so importing this package (or its
registry) imports no torch; ``registry.family_names()`` lists the families cheaply.
"""

from __future__ import annotations

from selfattn.lazy import lazy_names

_EXPORTS = {
    "BertModel": "selfattn.models.encoder",
    "mean_pool": "selfattn.models.encoder",
    "DecoderConfig": "selfattn.models.decoder",
    "DecoderModel": "selfattn.models.decoder",
    "FAMILIES": "selfattn.models.registry",
    "MODELS": "selfattn.models.files",
    "ModelOutput": "selfattn.models.model_output",
    "load_pretrained": "selfattn.models.pretrained",
}

__all__ = ["FAMILIES", "MODELS", "BertModel", "DecoderConfig", "DecoderModel", "ModelOutput", "load_pretrained", "mean_pool"]


__getattr__, __dir__ = lazy_names(globals(), _EXPORTS)
