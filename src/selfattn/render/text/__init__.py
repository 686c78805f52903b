"""Renderers of a Trace: the walkthrough document, text (rich), markdown and JSON."""
