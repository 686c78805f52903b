"""``train``: one run, from its settings to a folder holding the model and what it learned.

    settings -> task (batches by seed and step) -> GPT-2 model from our modules
             -> for each step: loss = mean -log p(target) over the batch, backward through our
                attention, clip, AdamW at the step's learning rate
             -> every log_every steps: validation loss, the probe's head scores and weights
             -> every checkpoint_every steps, at the end and on Ctrl-C: the checkpoint

Under ``torchrun --nproc_per_node=N`` each process takes its share of every step's batch
(the same global batch, cut in N), DistributedDataParallel over gloo averages the
gradients, and only rank 0 writes; the losses are averaged over the ranks, so the curve
is the single process's one up to float32 rounding.
"""

from __future__ import annotations

import json
import time

import torch

from selfattn.errors import TrainingError
import selfattn.training.probe as probes
import selfattn.training.run_files as files
from selfattn.training.settings import TrainConfig
from selfattn.training.distributed import Processes
from selfattn.training.gpt import model_config, new_model, save_model
from selfattn.training.progress import TrainingProgress
from selfattn.training.records import TrainingRun
from selfattn.training.start import check_start
from selfattn.training.step import (
    Interrupts,
    LanguageModel,
    next_token_loss,
    optimizer_for,
    train_step,
)
from selfattn.training.tasks import InductionTask, TextTask, min_text_chars
from selfattn.training.vocab import CharVocab

# Contexts below this train through the reference attention (packed_self_attention: its
# backward written out), longer ones through the flash kernel, forward and backward, whose
# memory is O(N). bench/train.py, the training step at 768 tokens a step (one sequence from
# 1024 on): flash / reference 1.28 at a context of 64, 1.28 at 128, 1.25 at 256, 1.10 at 512,
# 0.90 at 1024.
FLASH_MIN_CONTEXT = 1024


def attention_choice(context: int) -> tuple[str, str]:
    """The attention a run trains through, and the reason, by its context."""
    if context < FLASH_MIN_CONTEXT:
        return "reference", f"reference attention (context {context} < {FLASH_MIN_CONTEXT}: faster than the flash kernel there)"
    return "flash", f"flash attention, forward and backward (context {context} >= {FLASH_MIN_CONTEXT})"


def train(task: str | None = None, corpus=None, steps=None, out=None, seed=None, resume: bool = False,
          progress: bool = True, **settings) -> TrainingRun:
    """Train a small GPT-2 model from our modules; its folder holds the checkpoint and the metrics.

    Args:
        task: "induction" (the default: repeated random symbols, an induction head
            forms) or "text" (a character-level language model); resuming, the run's own.
        corpus: for "text": "shakespeare" (the default; ``make shakespeare`` fetches it)
            or a UTF-8 text file.
        steps: optimiser steps (default 1500 for induction, 2000 for text).
        out: the run's folder (default runs/TASK); new or empty, unless resuming.
        seed: seeds the weights and every batch (default 0); the same seed and number of
            threads give the same loss curve.
        resume: continue the run in ``out`` from its last checkpoint (steps may grow).
        progress: show a bar (terminal) or lines (piped) on stderr.
        settings: more ``TrainConfig`` fields (n_layers, d_model, context, batch_size,
            lr, log_every, ...).

    Returns:
        A ``TrainingRun``; ``run.induction_step`` says when an induction head formed.

    Raises:
        TrainingError: an unknown task or setting, a value out of range, a corpus that is
            missing, empty, binary or too short, an output folder that cannot be written
            or holds another run, or nothing to resume.
    """
    folder, config, saved = check_start(task, corpus, steps, out, seed, resume, **settings)
    vocab = CharVocab.from_json(saved["vocab"]) if resume else None
    processes = Processes.from_environment()
    try:
        processes.check_batch(config.batch_size)
        source, vocab = _task_source(config, vocab)
        if not resume:
            files.check_new_run_folder(folder, create=processes.is_main)
        processes.barrier()
        return _Run(config, vocab, source, folder, processes, resume, progress).go()
    finally:
        processes.close()


def _task_source(config: TrainConfig, vocab: CharVocab | None):
    if config.task == "induction":
        vocab = vocab or CharVocab.for_induction(config.symbols)
        return InductionTask(vocab, config.context, config.seed, config.min_repeat), vocab
    from selfattn.training.corpus import read_corpus

    text = read_corpus(config.corpus, min_text_chars(config.context))
    vocab = vocab or CharVocab.for_text(text)
    return TextTask(vocab.encode_tensor(text), vocab, config.context, config.seed), vocab


class _Run:
    """The state of one run while it trains (see ``train``)."""

    def __init__(self, config, vocab, source, folder, processes, resume, progress) -> None:
        self.config, self.vocab, self.source, self.folder, self.processes = config, vocab, source, folder, processes
        impl, self.attention = attention_choice(config.context)
        dims = (config.context, config.n_layers, config.n_heads, config.d_model, impl)
        self.model = new_model(model_config(vocab, *dims), config.seed)
        self.step, self.interval = 0, [0.0, 0, 0.0]  # loss sum, steps, seconds since the last log
        self.optimizer = optimizer_for(self.model, config)
        self.elapsed = 0.0  # seconds spent in training steps, over every session of the run
        self.probe, self.repeat, self.offset = probes.probe_ids(vocab, config.context)
        if resume:
            self._load_state()
        self.network = processes.wrap(LanguageModel(self.model))
        self.show = progress and processes.is_main
        self.stop_asked = False

    def go(self) -> TrainingRun:
        began = time.perf_counter()
        if self.processes.is_main and self.step == 0:
            self._write_settings()
        start = self.step
        with TrainingProgress(self.config.steps, start, self.show) as bar, Interrupts(self):
            bar.note(f"training {self.config.task} through {self.attention}; {self.processes.describe()}")
            while self.step < self.config.steps and not self.processes.any(self.stop_asked):
                loss = self._train_step()
                bar.update(self.step, loss, self._tokens_per_s())
                if self.step % self.config.log_every == 0 or self.step == self.config.steps:
                    record = self._log()
                    bar.log(record)
                if self.step % self.config.checkpoint_every == 0 or self.step == self.config.steps:
                    self._save()
            if self.step < self.config.steps:
                self._save()
                bar.note(f"interrupted at step {self.step}: checkpoint saved in {self.folder}; continue with --resume")
        self.processes.barrier()
        metrics = files.read_metrics(self.folder) if (self.folder / files.METRICS).is_file() else []
        return TrainingRun(self.folder, self.config, self.step, self.step >= self.config.steps, self.attention,
                           metrics, time.perf_counter() - began, self.processes.world, self.processes.rank)

    def _train_step(self) -> float:
        began = time.perf_counter()
        lr = self.config.learning_rate(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        inputs, targets = self.source.batch(self.step, self.config.batch_size)
        inputs, targets = self.processes.share(inputs), self.processes.share(targets)  # this rank's rows
        value = self.processes.mean(train_step(self.network, self.optimizer, inputs, targets, self.config.grad_clip))
        self.step += 1
        self.interval[0] += value
        self.interval[1] += 1
        self.interval[2] += time.perf_counter() - began
        self.elapsed += time.perf_counter() - began
        return value

    def _tokens_per_s(self) -> float:
        seconds = self.interval[2]
        return self.interval[1] * self.config.batch_size * self.config.context / seconds if seconds > 0 else 0.0

    def _log(self) -> dict:
        record = None
        if self.processes.is_main:
            weights, probe_loss = probes.run_probe(self.model, self.probe, self.repeat, self.offset)
            record = {
                "step": self.step,
                "train_loss": self.interval[0] / max(1, self.interval[1]),  # the mean over the steps since the last record
                "val_loss": self._val_loss(),
                "lr": self.config.learning_rate(self.step - 1),
                "tokens_per_s": round(self._tokens_per_s(), 1),
                "elapsed_s": round(self.elapsed, 2),
                "probe_loss": probe_loss,
                "heads": probes.head_scores(weights, self.probe, self.repeat, self.offset),
            }
            files.append_metrics(self.folder, record)
            probes.save_snapshot(self.folder / "probe", self.step, weights)
        self.interval = [0.0, 0, 0.0]
        return record

    def _val_loss(self) -> float:
        self.model.eval()
        with torch.no_grad():
            losses = [next_token_loss(LanguageModel(self.model)(x), y)
                      for x, y in (self.source.val_batch(i, self.config.batch_size) for i in range(self.config.eval_batches))]
        self.model.train()
        return float(torch.stack(losses).mean())

    def _save(self) -> None:
        if self.processes.is_main:
            save_model(self.model, self.vocab, self.folder)
            state = {"step": self.step, "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                     "interval": self.interval[:2], "elapsed": self.elapsed}
            temporary = self.folder / (files.STATE + ".partial")
            torch.save(state, temporary)
            temporary.replace(self.folder / files.STATE)
            self._write_settings()
        self.processes.barrier()

    def _write_settings(self) -> None:
        files.write_settings(self.folder, {
            "config": self.config.to_json(), "vocab": self.vocab.to_json(), "attention": self.attention,
            "step": self.step, "finished": self.step >= self.config.steps, "world_size": self.processes.world,
            "threads": torch.get_num_threads(), "torch": torch.__version__,
        })
        if not (self.folder / files.PROBE).is_file():
            probe = {"ids": self.probe.tolist(), "tokens": [self.vocab.token(i) for i in self.probe.tolist()],
                     "repeat": self.repeat, "offset": self.offset}
            files.write_whole(self.folder / files.PROBE, json.dumps(probe) + "\n")

    def _load_state(self) -> None:
        try:
            state = torch.load(self.folder / files.STATE, weights_only=True)
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        except (OSError, RuntimeError, KeyError, ValueError) as error:
            raise TrainingError(f"cannot resume from {self.folder / files.STATE}: {str(error).splitlines()[0]}") from None
        self.step = int(state["step"])
        self.interval = [float(state["interval"][0]), int(state["interval"][1]), 0.0]
        self.elapsed = float(state.get("elapsed", 0.0))
        if self.processes.is_main:
            files.keep_metrics_until(self.folder, self.step)
            for snapshot in (self.folder / "probe").glob("step-*.safetensors"):
                if int(snapshot.stem.split("-")[1]) > self.step:
                    snapshot.unlink()
