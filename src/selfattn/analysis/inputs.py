"""What the analyses take besides a model, by name and default, checked before a model loads.

The probes (``probes``) and their defaults, the ablation modes (``interventions``), and
the two sentences of a comparison with the options it passes on (``comparison``).
Plain Python: the command line checks --probe, --probe-length, --seed and --mode before
torch loads.
"""

from __future__ import annotations

from selfattn.errors import OptionError

PROBES = ("induction",)
PROBE_LENGTH, PROBE_SEED = 20, 0  # --probe-length and --seed when not given
ABLATION_MODES = ("zero", "mean")  # a knocked-out head's output: zero, or its mean over the positions
COMPARED = ("A", "B")  # the two sentences a comparison puts side by side
# The ExplainConfig fields compare passes on; the rest (sentence, query, model, format,
# precision, layer, head) are its own or do not apply to a comparison.
COMPARE_OPTIONS = ("embeddings", "embed", "dim", "seed", "variant", "heads", "kv_heads", "d_k", "positional", "block_size")


def check_probe_options(sentence: str | None, probe: str | None, probe_length, seed) -> None:
    """Refuse probe options that cannot work, before the model loads.

    Args:
        sentence: the user's sentence, or None.
        probe: None, or the probe's kind (one of PROBES).
        probe_length: --probe-length, or None when not given.
        seed: --seed, or None when not given.

    Raises:
        OptionError: an unknown probe, a probe with a sentence, a length below 2 or a
            negative seed, or --probe-length / --seed without a probe.
    """
    if probe is None:
        if probe_length is not None or seed is not None:
            raise OptionError("--probe-length and --seed set up the probe: give them with --probe induction")
        return
    if probe not in PROBES:
        raise OptionError(f"unknown probe {probe!r}: choose one of {', '.join(PROBES)}")
    if sentence is not None:
        raise OptionError(f"--probe {probe} makes its own input: give no sentence with it")
    if probe_length is not None and (isinstance(probe_length, bool) or not isinstance(probe_length, int) or probe_length < 2):
        raise OptionError(f"--probe-length must be a whole number of at least 2, got {probe_length!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise OptionError(f"--seed must be a whole number of at least 0, got {seed!r}")
