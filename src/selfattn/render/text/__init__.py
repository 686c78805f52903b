"""Renderers of the record (``AttentionTrace``): the walkthrough document, text (rich), markdown and JSON."""
