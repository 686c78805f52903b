"""``selfattn train``: run ``train`` and say what came of it, in a few lines on stdout.

Progress goes to stderr (a bar in a terminal, lines when piped); the summary to stdout.
An interrupted run (Ctrl-C) has saved its checkpoint and exits with status 130.
"""

from __future__ import annotations

from selfattn.errors import TrainingError
from selfattn.training.loop import train
from selfattn.training.records import INDUCTION_FORMED, role_line, strongest

EXIT_INTERRUPTED = 130


def train_command(task, corpus, steps, out, seed, resume: bool, stdout) -> int:
    """Train and print the summary; returns the exit status (0, or 130 when interrupted).

    Raises:
        TrainingError: bad settings or folders (the CLI prints one line, status 2).
    """
    if task is not None and not isinstance(task, str):
        raise TrainingError(f"the task must be a name, got {task!r}")
    run = train(task, corpus=corpus, steps=steps, out=out, seed=seed, resume=resume)
    if run.rank != 0:  # under torchrun only rank 0 reports
        return 0 if run.finished else EXIT_INTERRUPTED
    print(summary(run), file=stdout)
    return 0 if run.finished else EXIT_INTERRUPTED


def summary(run) -> str:
    """What a run did, as lines: where, how far, the losses, the heads, and what to try next."""
    c, final = run.config, run.final
    lines = [f"run {run.folder}: {c.task}, step {run.step} of {c.steps}" + ("" if run.finished else " (interrupted)")]
    lines.append(f"attention: {run.attention}; {run.world_size} process(es); {run.wall_s:.1f} s")
    if final is not None:
        lines.append(f"loss: train {final['train_loss']:.3f}, validation {final['val_loss']:.3f}")
        probe = final["probe_loss"]
        lines.append(f"probe: loss {probe['first_copy']:.2f} on its first copy, {probe['second_copy']:.2f} on the repeat")
        best = strongest(final["heads"], "induction")
        previous = strongest(final["heads"], "previous_token")
        formed = run.induction_step
        when = f"formed by step {formed}" if formed is not None else f"not formed (below {INDUCTION_FORMED})"
        lines.append(f"induction head: layer {best['layer']} head {best['head']}, stripe score {best['induction']:.2f} "
                     f"on the run's probe, {when}")
        lines.append(f"previous-token head: layer {previous['layer']} head {previous['head']}, score {previous['previous_token']:.2f}")
        lines.append(f"heads by role (the highest of its probe scores, when it reaches 0.40): {role_line(final['heads'])}")
        lines.append("(stripe score: the mean weight from each token of the probe's second copy to the token after its "
                     "first copy; `selfattn heads --probe induction` draws its own random probe and scores it the same "
                     "way, so its numbers differ a little)")
    if not run.finished:
        lines.append(f"continue with: selfattn train --out {run.folder} --resume")
    else:
        lines.append(f"next: selfattn plot --training {run.folder} --kind training -o training.png")
        lines.append(f"      selfattn heads --model {run.folder} --probe induction")
    return "\n".join(lines)

