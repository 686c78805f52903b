"""Pretrained models run through our own attention (loaders, tokenizers, outputs)."""

from selfattn.models.bert import BertModel, load_pretrained, mean_pool
from selfattn.models.files import MODELS
from selfattn.models.output import ModelOutput

__all__ = ["BertModel", "MODELS", "ModelOutput", "load_pretrained", "mean_pool"]
