"""One file per model family, named after config.json's model_type; each defines ``FAMILY``.

The registry (``selfattn.models.registry``) lists this folder, so a new family is one new
file here (and its test). Llama-shaped families build their record with
``selfattn.models.llama_layout.llama_family`` and state only how they differ. This
package imports nothing, so listing it imports no torch.
"""
