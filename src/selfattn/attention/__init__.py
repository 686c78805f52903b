"""The attention family, built from the seed's step functions (``selfattn.pipeline.steps``)."""
