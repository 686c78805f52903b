"""all-MiniLM-L6-v2: our forward pass against transformers' BertModel, in one run, with ratios.

Both run the same weights on the same token ids, in inference mode, interleaved round
by round (the order rotates) so that load changes on a shared machine hit all alike.
transformers runs with its default attention (sdpa: PyTorch's fused kernel) and with
"eager" (its plain softmax path). We report the median and the minimum per pass, the
ratio ours / theirs of each, and the largest difference in the last hidden state.

    .venv/bin/python bench/minilm.py [--rounds 30] [--threads 2]

Needs the model package and transformers (both installed by `make install`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from selfattn import load_pretrained
from selfattn.models.files import model_folder
from selfattn.models.tokenizer import Encoded

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import machine_line  # noqa: E402

SEED_SENTENCE = "The cat sat on the warm mat"


def token_batch(model, length: int | None) -> Encoded:
    """The seed sentence (9 tokens), or a text cut to exactly ``length`` tokens ending in [SEP]."""
    if length is None:
        return model.tokenize(SEED_SENTENCE)
    full = model.tokenize(f"{SEED_SENTENCE}. " * (length // 8 + 1))  # 8 tokens per sentence: long enough
    ids = torch.cat([full.input_ids[:, : length - 1], full.input_ids[:, -1:]], dim=1)  # keep [SEP] at the end
    tokens = [full.tokens[0][: length - 1] + ["[SEP]"]]
    return Encoded(tokens, ids, torch.ones_like(ids))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import BertModel
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    ours = load_pretrained("all-MiniLM-L6-v2")
    folder = str(model_folder("all-MiniLM-L6-v2"))
    theirs = {
        impl: BertModel.from_pretrained(folder, attn_implementation=impl, local_files_only=True).eval()
        for impl in ("sdpa", "eager")
    }
    print(machine_line())
    print(f"float32, inference mode, {args.rounds} interleaved rounds")
    print(f"{'input':<10} {'ours ms':>16} {'sdpa ms':>16} {'eager ms':>16} {'ours/sdpa':>14} {'ours/eager':>14} {'max |diff|':>11}")
    with torch.inference_mode():
        for length in (None, 256):
            batch = token_batch(ours, length)
            ids, mask = batch.input_ids, batch.attention_mask
            runs = {
                "ours": lambda: ours.run(batch).last_hidden_state,
                "sdpa": lambda: theirs["sdpa"](input_ids=ids, attention_mask=mask).last_hidden_state,
                "eager": lambda: theirs["eager"](input_ids=ids, attention_mask=mask).last_hidden_state,
            }
            diff = float((runs["ours"]() - runs["eager"]()).abs().max())
            times = {name: [] for name in runs}
            names = list(runs)
            for round_ in range(args.rounds + 2):
                for name in names[round_ % 3 :] + names[: round_ % 3]:
                    start = time.perf_counter()
                    runs[name]()
                    if round_ >= 2:  # two warm-up rounds
                        times[name].append(time.perf_counter() - start)
            med = {name: statistics.median(t) * 1e3 for name, t in times.items()}
            low = {name: min(t) * 1e3 for name, t in times.items()}
            cell = {name: f"{med[name]:.1f} (min {low[name]:.1f})" for name in runs}
            ratio = {
                other: f"{med['ours'] / med[other]:.2f} ({low['ours'] / low[other]:.2f})" for other in ("sdpa", "eager")
            }
            label = f"{ids.shape[1]} tokens"
            print(
                f"{label:<10} {cell['ours']:>16} {cell['sdpa']:>16} {cell['eager']:>16} "
                f"{ratio['sdpa']:>14} {ratio['eager']:>14} {diff:11.1e}"
            )
    print("ratios: median (minimum); below 1.00 means ours is faster")


if __name__ == "__main__":
    main()
