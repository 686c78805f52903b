"""A random Llama-shaped decoder: our DecoderModel against transformers' LlamaForCausalLM, in one run.

The model: transformers' LlamaConfig with 8 layers, width 512, 8 query heads and 2
key/value heads of 64, a SwiGLU hidden width of 1376, a vocabulary of 32000 and untied
embeddings (54.9M parameters, 22.2M of them in the blocks). Its weights are drawn with std 0.2 and its norm gains
jittered (tests/tiny_models.py's ``build_reference``), saved with ``save_pretrained``
into a temporary folder beside a byte-level BPE tokenizer (only the ids are used), and
loaded twice: ``selfattn.load_pretrained(folder)`` and
``AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa")``. Both run
in float32, eval mode, without gradients, on the same number of threads.

Two measurements, the two sides interleaved round by round (the order alternates), so
that load changes on a shared machine hit both alike:

    forward    one pass over 512 random token ids (batch 1), logits for every position
    generate   128 new tokens after a 16-token prompt, greedy, with the KV cache:
               ours model.generate(ids, max_new_tokens=128) against transformers'
               generate(do_sample=False, max_new_tokens=128, min_new_tokens=128)

The checkpoint has no end-of-sequence id, so both sides make exactly 128 tokens. Before
timing, the script checks that both do the same work: the largest |difference| of the
forward's logits, and whether the greedy ids agree. It prints the median and the
minimum of each side and the ratios ours / transformers (target: forward <= 1.1,
generate <= 1.2).

    .venv/bin/python bench/models.py                    # ~35 s on 2 quiet cores
    .venv/bin/python bench/models.py --quick            # ~10 s: fewer rounds, 256 tokens, 32 new
    options: --rounds R (forward rounds, default 20)  --gen-rounds R (default 7)  --threads T
             --tokens N  --new-tokens N  --seed S (the random weights)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from tiny_models import build_reference, write_tokenizer  # noqa: E402

import selfattn  # noqa: E402

SIZES = dict(
    vocab_size=32000, hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
    num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=2048,
)
PROMPT = 16


def make_checkpoint(folder: Path, seed: int = 0) -> Path:
    """Save the random Llama-shaped model and a tokenizer into ``folder`` (see the module docstring)."""
    import transformers

    config = transformers.LlamaConfig(
        **SIZES, initializer_range=0.2, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=None, pad_token_id=0,  # no end-of-sequence id: every run makes all its tokens
    )
    build_reference(config, seed).save_pretrained(folder)
    write_tokenizer("llama", folder)
    return folder


def load_theirs(folder: Path, attn_implementation: str = "sdpa"):
    """transformers' model of the checkpoint, eval mode."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    return AutoModelForCausalLM.from_pretrained(
        folder, attn_implementation=attn_implementation, local_files_only=True
    ).eval()


def load_both(folder: Path):
    """(ours, theirs): the same checkpoint through selfattn and through transformers (sdpa), eval."""
    return selfattn.load_pretrained(folder), load_theirs(folder)


def logits_floor(folder: Path, ids: torch.Tensor, reference: torch.Tensor) -> float:
    """max |logits| difference between transformers' own eager and sdpa paths: float32's noise here."""
    with torch.no_grad():
        eager = load_theirs(folder, "eager")(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    return float((eager - reference).abs().max())


def interleaved(runs: dict, rounds: int, warmup: int = 1) -> dict[str, list[float]]:
    """Seconds per call of each run, ``rounds`` times, the order alternating each round."""
    names = list(runs)
    times = {name: [] for name in names}
    for round_ in range(warmup + rounds):
        order = names if round_ % 2 == 0 else names[::-1]
        for name in order:
            start = time.perf_counter()
            runs[name]()
            if round_ >= warmup:
                times[name].append(time.perf_counter() - start)
    return times


def summary(label: str, times: dict[str, list[float]], extra: str) -> dict:
    med = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    low = {name: min(t) * 1e3 for name, t in times.items()}
    return dict(
        label=label, ours=med["ours"], ours_min=low["ours"], theirs=med["transformers"], theirs_min=low["transformers"],
        ratio=med["ours"] / med["transformers"], ratio_min=low["ours"] / low["transformers"], check=extra,
        rounds=len(times["ours"]),
    )


def measure(ours, theirs, folder: Path, args) -> list[dict]:
    """The forward and the generation rows of the table."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, SIZES["vocab_size"], (1, args.tokens), generator=g)  # (1, tokens): no special ids
    prompt = ids[:, :PROMPT]  # (1, PROMPT)
    ones = torch.ones_like(ids)
    new = args.new_tokens
    with torch.no_grad():
        mine = ours(ids).logits  # (1, tokens, vocab)
        reference = theirs(input_ids=ids, attention_mask=ones).logits
        diff = float((mine - reference).abs().max())
        scale = float(reference.abs().max())
        floor = logits_floor(folder, ids, reference)
        forward = {
            "ours": lambda: ours(ids),
            "transformers": lambda: theirs(input_ids=ids, attention_mask=ones),
        }
        rows = [summary(
            f"forward, {args.tokens} tokens", interleaved(forward, args.rounds),
            f"max |logit diff| {diff:.1e}; transformers eager vs sdpa {floor:.1e} (logits up to {scale:.0f})",
        )]

        def generate_theirs():
            out = theirs.generate(
                input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                max_new_tokens=new, min_new_tokens=new, pad_token_id=0,
            )
            return out[0, PROMPT:].tolist()

        mine_ids = ours.generate(prompt, max_new_tokens=new).ids[0]
        their_ids = generate_theirs()
        same = sum(a == b for a, b in zip(mine_ids, their_ids))
        agree = f"greedy ids: {len(mine_ids)} and {len(their_ids)} made, {same} of {new} equal"
        generate = {
            "ours": lambda: ours.generate(prompt, max_new_tokens=new),
            "transformers": generate_theirs,
        }
        rows.append(summary(
            f"generate, {PROMPT} + {new} tokens", interleaved(generate, args.gen_rounds), agree,
        ))
    return rows


def print_table(rows: list[dict], header: str) -> None:
    print(header)
    print(f"{'measure':<24} {'ours ms':>18} {'transformers ms':>18} {'ours/transformers':>18}  same work?")
    for r in rows:
        ours = f"{r['ours']:.1f} (min {r['ours_min']:.1f})"
        theirs = f"{r['theirs']:.1f} (min {r['theirs_min']:.1f})"
        ratio = f"{r['ratio']:.2f} ({r['ratio_min']:.2f})"
        print(f"{r['label']:<24} {ours:>18} {theirs:>18} {ratio:>18}  {r['check']}")
    print("ratios: of medians (of minima); below 1.00 means ours is faster; targets: forward 1.10, generate 1.20")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds, 256 tokens, 32 new tokens: a smoke check")
    parser.add_argument("--rounds", type=int, default=None, help="forward rounds (default 20; 3 with --quick)")
    parser.add_argument("--gen-rounds", type=int, default=None, help="generation rounds (default 7; 2 with --quick)")
    parser.add_argument("--tokens", type=int, default=None, help="forward length (default 512; 256 with --quick)")
    parser.add_argument("--new-tokens", type=int, default=None, help="tokens to generate (default 128; 32 with --quick)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--seed", type=int, default=0, help="the random weights' seed")
    args = parser.parse_args()
    quick = args.quick
    args.rounds = args.rounds or (3 if quick else 20)
    args.gen_rounds = args.gen_rounds or (2 if quick else 7)
    args.tokens = args.tokens or (256 if quick else 512)
    args.new_tokens = args.new_tokens or (32 if quick else 128)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    begun = time.perf_counter()
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        folder = make_checkpoint(Path(tmp) / "llama-shaped", args.seed)
        ours, theirs = load_both(folder)
        rows = measure(ours, theirs, folder, args)
    import transformers

    header = (
        f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} threads, "
        f"float32, no_grad; {sum(p.numel() for p in ours.parameters()) / 1e6:.1f}M parameters; ours attn_impl "
        f"{ours.config.attn_impl!r}, transformers {theirs.config._attn_implementation!r}; load average "
        f"{load[0]:.2f} at start, {os.getloadavg()[0]:.2f} at end ({os.cpu_count()} CPUs); "
        f"{time.perf_counter() - begun:.0f} s"
    )
    print_table(rows, header)


if __name__ == "__main__":
    main()
