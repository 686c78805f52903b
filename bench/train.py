"""Training: our GPT-2 against a plain-torch peer, reference against flash attention, and what the runs learn.

Four measurements in one run; the timed sides alternate block by block (the order flips
each block) after a warm-up block, so that load on a shared machine hits them alike:

  a. step     nanoGPT's CPU recipe (4 layers, 4 heads, width 128, context 64, batch 12, no
              dropout) on the Shakespeare text: one training step (loss, backward, clip to
              norm 1, AdamW from ``optimizer_for``) of our DecoderModel, through the attention
              ``attention_choice`` picks, against bench/peer_gpt.py's GPT (fused qkv, torch's
              scaled_dot_product_attention), both from the same weights, on the same batches.
              Median ms per step; target ours / peer <= 1.10. Above it, where the time goes:
              torch.profiler's operators side by side, and our step with parts of its attention
              swapped for others (patched here as a diagnosis; nothing in src/ changes).
  b. attention  the same step through our reference attention and through the flash kernel
              (forced: flash_min_queries 1) at contexts 64 to 1024, batch 768 / context (at least 1),
              the peer beside them: the evidence for FLASH_MIN_CONTEXT in training/loop.py.
  c. loss     ``train(task="text", steps=2000)`` (the nanoGPT recipe): the validation loss beside
              nanoGPT's published 1.88, and the peer trained from the same weights on the same
              batches with the same schedule; both also over 200 validation batches.
  d. induction  the default ``train("induction")``: seconds until an induction head forms, and in all.

    .venv/bin/python bench/train.py               # about 6 minutes on 2 quiet cores; writes docs/training-bench.md
    .venv/bin/python bench/train.py --quick       # a smoke check: few steps, 50-step runs; prints, writes no page
    options: --threads T (default 2)  --skip-loss (a and b only)  --out PAGE  --blocks N (a's timed blocks)
             --profile (a's diagnosis even when ours is within 1.10)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe  # noqa: E402
from peer_gpt import PeerGPT, copy_from_ours  # noqa: E402

from selfattn.attention import paths  # noqa: E402
from selfattn.attention.functional import AttentionOutput  # noqa: E402
from selfattn.training import train  # noqa: E402
from selfattn.training.settings import TrainConfig  # noqa: E402
from selfattn.training.corpus import read_shakespeare  # noqa: E402
from selfattn.training.loop import (  # noqa: E402
    FLASH_MIN_CONTEXT, LanguageModel, attention_choice, next_token_loss, optimizer_for, train_step)
from selfattn.training.gpt import model_config, new_model  # noqa: E402
from selfattn.training.run_files import STATE  # noqa: E402
from selfattn.training.tasks import TextTask  # noqa: E402
from selfattn.training.vocab import CharVocab  # noqa: E402

RECIPE = TrainConfig.for_task("text")  # nanoGPT's CPU recipe: 4 x 4 x 128, context 64, batch 12
NANOGPT_VAL = 1.88  # nanoGPT's README, the same recipe on its 1.1 MB tiny-shakespeare
TOKENS_PER_STEP = RECIPE.batch_size * RECIPE.context  # 768, kept about level across b's contexts
VAL_BATCHES = 200  # nanoGPT's eval_iters default (its CPU recipe used 20)


@dataclasses.dataclass
class Side:
    """One timed model: what training calls, its optimiser, and what each block runs inside."""

    network: torch.nn.Module
    optimizer: torch.optim.Optimizer
    patch: object = contextlib.nullcontext


def ours(vocab, context: int, impl: str, force: bool = False, seed: int = 0):
    """Our GPT-2 of the recipe's sizes; force=True makes "flash" run the kernel at any length."""
    model = new_model(model_config(vocab, context, RECIPE.n_layers, RECIPE.n_heads, RECIPE.d_model, impl), seed)
    if force:  # DecoderConfig's flash_min_queries is FLASH_MIN_QUERIES (128): shorter calls would take the reference path
        for layer in model.layers:
            layer.attention.config = dataclasses.replace(layer.attention.config, flash_min_queries=1)
    return model


def peer_of(model) -> PeerGPT:
    peer = PeerGPT.like(model.config)
    copy_from_ours(peer, model)
    return peer.train()


def side(model, network=None, patch=contextlib.nullcontext) -> Side:
    return Side(network or LanguageModel(model), optimizer_for(model, RECIPE), patch)


def time_steps(sides: dict[str, Side], task: TextTask, batch: int, blocks: int, per_block: int) -> dict[str, list[float]]:
    """Seconds of each side's training steps; block 0 warms up; every side gets the same batches."""
    names, times = list(sides), {name: [] for name in sides}
    for block in range(1 + blocks):
        for name in names if block % 2 == 0 else names[::-1]:
            s = sides[name]
            with s.patch():
                for i in range(per_block):
                    inputs, targets = task.batch(block * per_block + i, batch)
                    began = time.perf_counter()
                    train_step(s.network, s.optimizer, inputs, targets, RECIPE.grad_clip)
                    if block:
                        times[name].append(time.perf_counter() - began)
    return times


def ms(times: list[float]) -> tuple[float, float]:
    return statistics.median(times) * 1e3, min(times) * 1e3


def same_numbers(model, peer: PeerGPT, task: TextTask) -> tuple[float, float]:
    """max |logits difference| and max |gradient difference| of the token embedding, one batch."""
    inputs, targets = task.batch(0, RECIPE.batch_size)
    logits = [LanguageModel(model)(inputs), peer(inputs)]
    for values in logits:
        next_token_loss(values, targets).backward()
    grads = [model.embed.weight.grad, peer.tokens.weight.grad]
    logit_diff = float((logits[0] - logits[1]).detach().abs().max())
    grad_diff = float((grads[0] - grads[1]).abs().max())
    assert logit_diff <= 1e-5 and grad_diff <= 1e-5, f"the peer computes other numbers: {logit_diff:.1e}, {grad_diff:.1e}"
    model.zero_grad(set_to_none=True)
    peer.zero_grad(set_to_none=True)
    return logit_diff, grad_diff


# -- diagnostics: our step with its attention swapped (patched here, for the timing only) --

@contextlib.contextmanager
def swapped(owner, name: str, replacement):
    original = getattr(owner, name)
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        setattr(owner, name, original)


@contextlib.contextmanager
def swapped_path(name: str, declines):
    """The registry's path ``name`` with another ``declines`` for the duration."""
    original = paths.PATHS[name]
    paths.PATHS[name] = original._replace(declines=declines)
    try:
        yield
    finally:
        paths.PATHS[name] = original


def _sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False, need_weights=True):
    return AttentionOutput(F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale), None)  # causal only


def _unpacked():
    """Training self-attention the general way: three products, heads split, softmax_attention."""
    return swapped_path("packed", lambda *args: "switched off by the benchmark")


@contextlib.contextmanager
def _unpacked_with_sdpa():
    with _unpacked(), swapped(paths, "attention_forward", _sdpa):
        yield


VARIANTS = {  # label: the patch around our step
    "ours, as it is (packed_self_attention)": contextlib.nullcontext,
    "ours, unpacked: q, k, v from one product, heads split, softmax_attention": _unpacked,
    "ours, unpacked, attention by F.scaled_dot_product_attention": _unpacked_with_sdpa,
}


def variant_difference(model, task: TextTask) -> float:
    """The largest |gradient difference| of any variant from our plain step, one batch (asserted small)."""
    inputs, targets = task.batch(0, RECIPE.batch_size)
    grads = {}
    for label, patch in VARIANTS.items():
        with patch():
            next_token_loss(LanguageModel(model)(inputs), targets).backward()
        grads[label] = [p.grad for p in model.parameters()]
        model.zero_grad(set_to_none=True)
    plain = grads.pop("ours, as it is (packed_self_attention)")
    worst = max(float((a - b).abs().max()) for g in grads.values() for a, b in zip(g, plain))
    assert worst <= 1e-5, f"a variant computes other gradients: {worst:.1e}"
    return worst


def operator_table(sides: dict[str, Side], task: TextTask, steps: int, top: int = 14) -> list[tuple]:
    """(operator, ms per step and calls per step for each side) of the operators that cost either side most.

    Self CPU time, made robust to a busy machine: per operator and input shapes, the median
    call times the calls, so that one call the scheduler interrupted does not count tenfold.
    """
    from torch.profiler import ProfilerActivity, profile

    calls = {name: {} for name in sides}  # side -> (operator, shapes) -> self µs of each call
    for round_ in range(2 + steps):  # one step a side per round, the order flipping; two to warm up
        for name in list(sides) if round_ % 2 == 0 else list(sides)[::-1]:
            s = sides[name]
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                train_step(s.network, s.optimizer, *task.batch(round_, RECIPE.batch_size), RECIPE.grad_clip)
            if round_ >= 2:
                for event in prof.events():
                    calls[name].setdefault((event.name, str(event.input_shapes)), []).append(event.self_cpu_time_total)
    costs = {}
    for name, by_shape in calls.items():
        per_op = costs[name] = {}
        for (op, _), times in by_shape.items():
            cost = per_op.setdefault(op, [0.0, 0.0])
            cost[0] += statistics.median(times) * len(times) / 1e3 / steps
            cost[1] += len(times) / steps
    keys = set()
    for c in costs.values():
        keys |= set(sorted((k for k in c if not k.startswith("ProfilerStep")), key=lambda k: -c[k][0])[:top])
    rows = [(k, *[costs[n].get(k, (0.0, 0))[j] for n in sides for j in (0, 1)]) for k in keys]
    total = ("all operators", *[sum(v[j] for v in costs[n].values()) for n in sides for j in (0, 1)])
    return [total, *sorted(rows, key=lambda r: -max(r[1], r[3]))]


def step_comparison(task, vocab, args) -> dict:
    impl, why = attention_choice(RECIPE.context)
    model = ours(vocab, RECIPE.context, impl)
    peer = peer_of(model)
    check = same_numbers(model, peer, task)
    sides = {"ours": side(model), "peer": Side(peer, optimizer_for(peer, RECIPE))}
    times = time_steps(sides, task, RECIPE.batch_size, args.blocks, args.per_block)
    result = dict(impl=why, check=check, ours=ms(times["ours"]), peer=ms(times["peer"]), steps=len(times["ours"]))
    result["ratio"] = result["ours"][0] / result["peer"][0]
    result["ratio_min"] = result["ours"][1] / result["peer"][1]
    if result["ratio"] > 1.1 or args.profile:
        result["operators"] = operator_table(sides, task, args.profile_steps)
        result["variant_check"] = variant_difference(model, task)
        fresh = {label: side(model, patch=patch) for label, patch in VARIANTS.items()}
        fresh["peer"] = Side(peer, optimizer_for(peer, RECIPE))
        variant_times = time_steps(fresh, task, RECIPE.batch_size, max(2, args.blocks // 2), args.per_block)
        result["variants"] = {label: ms(t) for label, t in variant_times.items()}
    return result


def attention_comparison(text_ids, vocab, args) -> list[dict]:
    rows = []
    for context in args.contexts:
        batch = max(1, round(TOKENS_PER_STEP / context))
        task = TextTask(text_ids, vocab, context, 0)
        reference = ours(vocab, context, "reference")
        flash = ours(vocab, context, "flash", force=True)
        flash.load_state_dict(reference.state_dict())
        sides = {"reference": side(reference), "flash": side(flash)}
        peer = peer_of(reference)
        sides["peer"] = Side(peer, optimizer_for(peer, RECIPE))
        times = time_steps(sides, task, batch, args.attn_blocks, args.attn_per_block)
        row = dict(context=context, batch=batch, **{name: ms(t) for name, t in times.items()})
        row["flash_vs_ref"] = row["flash"][0] / row["reference"][0]
        row["chosen"] = attention_choice(context)[0]
        row["chosen_vs_peer"] = row[row["chosen"]][0] / row["peer"][0]
        rows.append(row)
    return rows


def val_loss(network, task: TextTask, batches: int) -> float:
    with torch.no_grad():
        losses = [next_token_loss(network(x), y) for x, y in (task.val_batch(i, RECIPE.batch_size) for i in range(batches))]
    return float(torch.stack(losses).mean())


def loss_runs(task: TextTask, vocab, args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        run = train(task="text", steps=args.text_steps, out=Path(tmp) / "text", progress=False)
        model = ours(vocab, RECIPE.context, attention_choice(RECIPE.context)[0])
        start = peer_of(model)  # the weights train() began from: the same seed, the same initialisation
        model.load_state_dict(torch.load(Path(tmp) / "text" / STATE, weights_only=True)["model"])
        model.eval()
        mine = dict(logged=run.final["val_loss"], full=val_loss(LanguageModel(model), task, VAL_BATCHES),
                    train=run.final["train_loss"], step_s=run.final["elapsed_s"], wall=run.wall_s)
        induction = train("induction", steps=args.induction_steps, out=Path(tmp) / "induction", progress=False)
    peer, config = start, dataclasses.replace(RECIPE, steps=args.text_steps)
    optimizer, spent, last = optimizer_for(peer, config), 0.0, []
    for step in range(config.steps):  # what _Run._train_step does, for the peer
        began = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = config.learning_rate(step)
        loss = train_step(peer, optimizer, *task.batch(step, config.batch_size), config.grad_clip)
        spent += time.perf_counter() - began
        last = (last + [float(loss)])[-config.log_every:]
    peer.eval()
    trained = PeerGPT.like(model.config)
    copy_from_ours(trained, model)  # ours after the run, in the peer's layout
    drift = max(float((a - b).abs().max()) for a, b in zip(trained.state_dict().values(), peer.state_dict().values()))
    theirs = dict(logged=val_loss(peer, task, config.eval_batches), full=val_loss(peer, task, VAL_BATCHES),
                  train=sum(last) / len(last), step_s=spent, drift=drift)
    formed = induction.induction_step
    at = next((r["elapsed_s"] for r in induction.metrics if r["step"] == formed), None)
    heads = dict(steps=induction.step, formed=formed, formed_s=at, step_s=induction.final["elapsed_s"],
                 wall=induction.wall_s, val=induction.final["val_loss"], attention=induction.attention)
    return dict(ours=mine, peer=theirs, induction=heads, steps=config.steps)


def machine(threads: int) -> str:
    """bench/machine.py's line for this CPU, with torch's threads, then Python's version."""
    return f"{describe().line(threads, torch.__version__)}; Python {platform.python_version()}"


def fmt(pair: tuple[float, float]) -> str:
    return f"{pair[0]:.1f} ({pair[1]:.1f})"


def threshold_verdict(rows: list[dict], level: float = 0.05) -> str:
    """Whether FLASH_MIN_CONTEXT splits the contexts where the kernel loses from those where it wins.

    Within ``level`` of each other the two count as level: a few percent is the noise of one run here.
    """
    def said(r):
        return f"{r['context']} ({r['flash_vs_ref']:.2f})"

    early = [r for r in rows if r["context"] < FLASH_MIN_CONTEXT and r["flash_vs_ref"] < 1 - level]
    late = [r for r in rows if r["context"] >= FLASH_MIN_CONTEXT and r["flash_vs_ref"] > 1 + level]
    even = [r for r in rows if abs(r["flash_vs_ref"] - 1) <= level]
    clear = next((r for r in rows if r["flash_vs_ref"] < 1 - level), None)
    faster = f"the kernel is clearly faster from {said(clear)} on" if clear else "the kernel is clearly faster nowhere"
    note = f" Level (within {level:.0%}) at {', '.join(map(said, even))}; {faster}." if even else ""
    if early:
        return (f"The kernel already wins at context {', '.join(map(said, early))}: FLASH_MIN_CONTEXT = "
                f"{FLASH_MIN_CONTEXT} should move down to {early[0]['context']}.{note}")
    if late:
        wins = next((r["context"] for i, r in enumerate(rows) if all(x["flash_vs_ref"] <= 1 + level for x in rows[i:])), None)
        where = f"up to {wins}" if wins else f"past {rows[-1]['context']}"
        return (f"The kernel loses at context {', '.join(map(said, late))}: FLASH_MIN_CONTEXT = {FLASH_MIN_CONTEXT} "
                f"should move {where}.{note}")
    return (f"FLASH_MIN_CONTEXT = {FLASH_MIN_CONTEXT} holds: the kernel is not clearly faster below it, nor clearly "
            f"slower from it on.{note}")


def row(*cells) -> str:
    """One markdown table row."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def step_section(a: dict) -> list[str]:
    out = ["### a. One training step, nanoGPT's CPU recipe", "",
           (f"4 layers, 4 heads, width 128, context 64, batch 12; ours through the {a['impl']}. {a['steps']} "
            f"timed steps a side. Same numbers before timing: largest logit difference {a['check'][0]:.1e}, "
            f"largest gradient difference of the token embedding {a['check'][1]:.1e}."), "",
           row("side", "ms per step, median (min)"), row("---", "---:"),
           row("ours (DecoderModel)", fmt(a["ours"])), row("peer (bench/peer_gpt.py)", fmt(a["peer"])),
           row("**ours / peer**", f"**{a['ratio']:.2f}** ({a['ratio_min']:.2f})"), ""]
    if "operators" not in a:
        return out
    out += [("Where the time goes: torch.profiler's self CPU time per step (per operator and shapes, the "
             "median call times the calls), for the operators that cost either side most."), "",
            row("operator", "ours ms", "ours calls", "peer ms", "peer calls"), row("---", "---:", "---:", "---:", "---:")]
    out += [row(k if k == "all operators" else f"`{k}`", f"{o:.2f}", f"{oc:.0f}", f"{p:.2f}", f"{pc:.0f}")
            for k, o, oc, p, pc in a["operators"]]
    peer = a["variants"]["peer"][0]
    out += ["", ("Our step with parts of its attention swapped (patched in this script only, as a diagnosis), "
                 f"timed together, interleaved; every variant gives our gradients to {a['variant_check']:.0e}."), "",
            row("variant", "ms per step, median (min)", "/ peer"), row("---", "---:", "---:")]
    return out + [row(label, fmt(t), f"{t[0] / peer:.2f}") for label, t in a["variants"].items()] + [""]


def attention_section(rows: list[dict]) -> list[str]:
    out = ["### b. Reference attention against the flash kernel", "",
           (f"The same step, batch 768 / context, the kernel forced at every length. Training takes the "
            f"reference path below context {FLASH_MIN_CONTEXT} and the kernel from it on (the chosen column)."), "",
           row("context", "batch", "reference ms", "flash ms", "flash / reference", "peer ms", "chosen / peer"),
           row("---:", "---:", "---:", "---:", "---:", "---:", "---:")]
    out += [row(r["context"], r["batch"], fmt(r["reference"]), fmt(r["flash"]), f"{r['flash_vs_ref']:.2f}",
                fmt(r["peer"]), f"{r['chosen_vs_peer']:.2f} ({r['chosen']})") for r in rows]
    return [*out, "", threshold_verdict(rows), ""]


def loss_section(c: dict) -> list[str]:
    o, p, h = c["ours"], c["peer"], c["induction"]
    formed = "not formed" if h["formed"] is None else h["formed"]
    return [f"### c. Validation loss after {c['steps']} steps", "",
            row("model", "val loss, 4 batches (as logged)", f"val loss, {VAL_BATCHES} batches", "train loss, last 50 steps",
                "s in steps"), row("---", "---:", "---:", "---:", "---:"),
            row('ours, `train(task="text")`', *(f"{o[k]:.4f}" for k in ("logged", "full", "train")), f"{o['step_s']:.0f}"),
            row("peer, same start, batches and schedule", *(f"{p[k]:.4f}" for k in ("logged", "full", "train")),
                f"{p['step_s']:.0f}"),
            row("nanoGPT's README (its corpus)", "", f"{NANOGPT_VAL:.2f} (20 batches)", "", ""), "",
            (f"After the {c['steps']} steps the largest difference between a weight of ours and the same weight of "
             f"the peer is {p['drift']:.1e}, float32 rounding grown over the steps. Ours took {o['wall']:.0f} s in all, "
             "validation, probes and checkpoints included. The two training times ran one after the other, not "
             "interleaved: part a is the fair ratio."), "",
            "### d. The default induction run", "",
            row("attention", "steps", "induction head at step", "s in steps until then", "s in steps, all", "s in all",
                "final val loss"), row("---", "---:", "---:", "---:", "---:", "---:", "---:"),
            row(h["attention"].split(" (")[0], h["steps"], formed, "—" if h["formed_s"] is None else h["formed_s"],
                f"{h['step_s']:.0f}", f"{h['wall']:.0f}", f"{h['val']:.3f}"), ""]


def reading(results: dict) -> list[str]:
    """What the figures say, in a few sentences computed from them."""
    a = results["step"]
    said = [f"- Ours takes {a['ratio']:.2f}x the peer's time per training step: "
            f"{'within' if a['ratio'] <= 1.1 else 'over'} the 1.10 target."]
    if "operators" in a:
        extra = sorted(a["operators"][1:], key=lambda r: r[3] - r[1])[:4]
        variants = a["variants"]
        best = min((t[0], label) for label, t in variants.items() if label != "peer")
        said.append("- Where ours spends more than the peer: " + ", ".join(
            f"`{k}` {o - p:+.2f} ms" for k, o, _, p, _ in extra) + f" per step ({a['operators'][0][1] - a['operators'][0][3]:+.1f} ms "
            f"over all operators). With parts of our attention swapped, the best variant, {best[1]}, takes "
            f"{best[0] / variants['peer'][0]:.2f}x the peer's time.")
    said.append("- " + threshold_verdict(results["attention"]))
    if "loss" in results:
        o, p = results["loss"]["ours"], results["loss"]["peer"]
        said.append(f"- After {results['loss']['steps']} steps ours reaches a validation loss of {o['full']:.3f} "
                    f"({VAL_BATCHES} batches; {o['logged']:.3f} as the run logged it), beside nanoGPT's {NANOGPT_VAL} on "
                    f"its smaller corpus; the peer, trained alike, ends "
                    + ("at the same loss to 4 decimals." if abs(p["full"] - o["full"]) < 5e-5 else
                       f"{p['full'] - o['full']:+.4f} from ours."))
    return ["## What the figures say", "", *said, ""]


def tables(results: dict) -> list[str]:
    out = step_section(results["step"]) + attention_section(results["attention"])
    out += loss_section(results["loss"]) if "loss" in results else []
    return out + reading(results)


def page(results: dict, command: str) -> str:
    corpus = results["corpus"]
    head = f"""# Training steps against a plain-torch GPT

How fast `selfattn.training` trains, next to the kind of GPT that people write by hand in
plain torch, in the same process; whether our flash kernel pays for itself in training;
and what the standard recipe reaches. `bench/train.py` measures it and wrote this page.

## What is measured

The peer (`bench/peer_gpt.py`) is a GPT-2 as small trainers usually write it: learned
position embeddings, pre-LN blocks with biased LayerNorms, one fused q/k/v projection,
torch's `scaled_dot_product_attention(is_causal=True)`, a 4x MLP with the tanh GELU, a
final LayerNorm and the output matrix tied to the token embedding. It has the sizes of our
model and starts from our model's weights, copied in by name; the script checks that both
give the same logits and gradients before it times anything. Both sides train through the
same `train_step` (the next-token loss, backward, gradient clipping to norm 1) with their
own AdamW from `optimizer_for`, and they get the same batches. The sides alternate in blocks of
steps, the order flipping each block, so that a busy moment hits both; the figures are
medians (minima in brackets) of single steps, and only the ratios carry over to other
machines.

The corpus is ours, not nanoGPT's: the {corpus['texts']} modern-spelling Gutenberg texts
of Shakespeare in shakespeare 0.6's archive, {corpus['chars'] / 1e6:.2f} M characters, {corpus['distinct']} distinct
({corpus['vocab']} ids with `<unk>`). nanoGPT's tiny-shakespeare has 1.1 M characters and 65
distinct ones. Both hold out the last 10% for validation, so the losses are relatives,
not the same measurement: ours is a larger corpus of every play and poem, with their
lists of persons and stage directions, and a larger alphabet.

## The command

```text
{command}
```

```text
.venv/bin/python bench/train.py            # everything, about 6 minutes on 2 quiet cores
.venv/bin/python bench/train.py --quick    # a smoke check: few steps, 50-step runs, prints only
options: --threads T (default 2)  --skip-loss (only a and b)  --out PAGE  --blocks N  --profile
```

## Figures

{results['machine']}. Load average {results['load'][0]:.2f} at the start and
{results['load'][1]:.2f} at the end; {results['seconds']:.0f} s in all.{' A --quick run: too few steps to trust.' if results['quick'] else ''}

"""
    return head + "\n".join(tables(results)).rstrip() + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few steps and 50-step runs; writes no page unless --out")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-loss", action="store_true", help="skip the 2000-step text run and the induction run")
    parser.add_argument("--out", default=None, help="the page to write (default docs/training-bench.md; none with --quick)")
    parser.add_argument("--blocks", type=int, default=None, help="a's timed blocks of steps (default 20; 2 with --quick)")
    parser.add_argument("--profile", action="store_true", help="profile a even when ours is within 1.10 of the peer")
    args = parser.parse_args()
    quick = args.quick
    args.blocks = args.blocks or (2 if quick else 20)
    args.per_block, args.profile_steps = (3, 3) if quick else (10, 20)
    args.attn_blocks, args.attn_per_block = (1, 2) if quick else (6, 5)
    args.contexts = (64, 128) if quick else (64, 128, 256, 512, 1024)
    args.text_steps, args.induction_steps = (50, 50) if quick else (RECIPE.steps, None)
    out = args.out or (None if quick else "docs/training-bench.md")
    torch.set_num_threads(args.threads)

    begun, load = time.perf_counter(), os.getloadavg()[0]
    text = read_shakespeare()
    vocab = CharVocab.for_text(text)
    ids = vocab.encode_tensor(text)
    task = TextTask(ids, vocab, RECIPE.context, RECIPE.seed)
    results = dict(quick=quick, corpus=dict(texts=42, chars=len(text), distinct=len(set(text)), vocab=vocab.size))
    results["step"] = step_comparison(task, vocab, args)
    print(f"a. ours / peer {results['step']['ratio']:.2f}", flush=True)
    results["attention"] = attention_comparison(ids, vocab, args)
    ratios = ", ".join(f"{r['context']}: {r['flash_vs_ref']:.2f}" for r in results["attention"])
    print(f"b. flash / reference {ratios}", flush=True)
    if not args.skip_loss:
        results["loss"] = loss_runs(task, vocab, args)
    results.update(machine=machine(torch.get_num_threads()), load=(load, os.getloadavg()[0]),
                   seconds=time.perf_counter() - begun)
    command = " ".join([".venv/bin/python bench/train.py", *sys.argv[1:]])
    text_page = page(results, command)
    print(text_page.split("## Figures", 1)[1])
    if out:
        Path(out).write_text(text_page, encoding="utf-8")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
