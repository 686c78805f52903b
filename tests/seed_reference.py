"""Numbers printed in the seed post, transcribed by hand (4 decimals, as printed there).

These are the independent reference: nothing here is produced by selfattn.
"""

SENTENCE = "The cat sat on the warm mat"
TOKENS = ["The", "cat", "sat", "on", "the", "warm", "mat"]
INPUTS = [
    [0.41, 0.12, 0.73],
    [0.58, 0.91, 0.44],
    [0.33, 0.76, 0.89],
    [0.15, 0.42, 0.67],
    [0.39, 0.14, 0.71],
    [0.82, 0.53, 0.29],
    [0.61, 0.85, 0.47],
]
QUERY_INDEX = 1  # "cat"
QUERY = [0.58, 0.91, 0.44]
CAT_SCORES = [0.6682, 1.3581, 1.2746, 0.7640, 0.6660, 1.0855, 1.3341]
CAT_EXP = [1.9507, 3.8888, 3.5773, 2.1468, 1.9464, 2.9609, 3.7966]
CAT_EXP_SUM = 20.2676
CAT_WEIGHTS = [0.0962, 0.1919, 0.1765, 0.1059, 0.0960, 0.1461, 0.1873]
CAT_WEIGHTS_SUM = 1.0000
CAT_CONTEXT = [0.4964, 0.6149, 0.5813]
ALL_SCORES = [
    [0.7154, 0.6682, 0.8762, 0.6010, 0.6950, 0.6115, 0.6952],
    [0.6682, 1.3581, 1.2746, 0.7640, 0.6660, 1.0855, 1.3341],
    [0.8762, 1.2746, 1.4786, 0.9650, 0.8670, 0.9315, 1.2656],
    [0.6010, 0.7640, 0.9650, 0.6478, 0.5930, 0.5399, 0.7634],
    [0.6950, 0.6660, 0.8670, 0.5930, 0.6758, 0.5999, 0.6906],
    [0.6115, 1.0855, 0.9315, 0.5399, 0.5999, 1.0374, 1.0870],
    [0.6952, 1.3341, 1.2656, 0.7634, 0.6906, 1.0870, 1.3155],
]
ROW_SUMS = [1.0] * 7


def at_4_decimals(values):
    """Round like the seed's printout (nested lists allowed)."""
    if isinstance(values, (list, tuple)):
        return [at_4_decimals(v) for v in values]
    return round(float(values), 4)
