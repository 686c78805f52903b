"""Pretrained models run through our own attention (loaders, tokenizers, outputs, generation)."""

from selfattn.models.bert import BertModel, mean_pool
from selfattn.models.decoder import DecoderConfig, DecoderModel
from selfattn.models.files import MODELS
from selfattn.models.output import ModelOutput
from selfattn.models.pretrained import FAMILIES, load_pretrained

__all__ = ["BertModel", "DecoderConfig", "DecoderModel", "FAMILIES", "MODELS", "ModelOutput", "load_pretrained", "mean_pool"]
