"""Copy finished runs into selfattn's own models: ``python -m selfattn.training.ship RUN NAME [RUN NAME ...]``.

``make trained-models`` trains tiny-induction and tiny-shakespeare with the commands
below and calls this, which keeps what a model needs and what made it (the settings and
metrics.jsonl; no optimiser state; the probe's attention for tiny-induction only) in src/selfattn/models/trained/NAME/,
with a README.md that gives the command and the final figures.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from selfattn.training.records import role_line, strongest
from selfattn.training.run_files import read_metrics, read_settings

KEPT = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
        "training.json", "metrics.jsonl", "probe.json")
COMMANDS = {
    "tiny-induction": "selfattn train --task induction --seed 0 --out runs/tiny-induction",
    "tiny-shakespeare": "selfattn train --task text --corpus shakespeare --seed 0 --out runs/tiny-shakespeare",
}
WITH_PROBE = ("tiny-induction",)  # about 2 MB; tiny-shakespeare's would pass the 10 MB the two may take
TRAINED = Path(__file__).resolve().parents[1] / "models" / "trained"


def ship(run: Path, name: str) -> Path:
    """Copy the finished run ``run`` to models/trained/``name``.   -> the folder written"""
    settings = read_settings(run)
    if not settings.get("finished"):
        raise SystemExit(f"{run} has not finished its steps")
    target = TRAINED / name
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for file in KEPT:
        shutil.copy2(run / file, target / file)
    if name in WITH_PROBE:  # the probe's attention at every logged step, for selfattn view --training
        shutil.copytree(run / "probe", target / "probe")
    final = read_metrics(run)[-1]
    best = strongest(final["heads"], "induction")
    previous = strongest(final["heads"], "previous_token")
    c = settings["config"]
    lines = [
        f"# {name}", "",
        f"Trained by selfattn {c['task']!r} with `{COMMANDS.get(name, '(see training.json)')}`",
        f"({c['steps']} steps, {c['n_layers']} layers, {c['n_heads']} heads, width {c['d_model']}, context {c['context']},",
        f"batch {c['batch_size']}, {settings['threads']} threads, torch {settings['torch']}; {settings['attention']}).", "",
        f"- final training loss {final['train_loss']:.4f}, validation loss {final['val_loss']:.4f}",
        f"- probe loss: {final['probe_loss']['first_copy']:.3f} on the first copy, {final['probe_loss']['second_copy']:.3f} on the repeat",
        f"- best induction head: layer {best['layer']} head {best['head']} (score {best['induction']:.3f})",
        f"- best previous-token head: layer {previous['layer']} head {previous['head']} (score {previous['previous_token']:.3f})",
        f"- heads by role (the highest of a head's probe scores, when it reaches 0.40): {role_line(final['heads'])}",
        "- time on a quiet 2-core machine: docs/training-bench.md", "",
        "metrics.jsonl holds every logged step; training.json the settings and the vocabulary.", "",
    ]
    (target / "README.md").write_text("\n".join(lines), encoding="utf-8")
    return target


if __name__ == "__main__":
    pairs = sys.argv[1:]
    for run_folder, model_name in zip(pairs[::2], pairs[1::2]):
        print(f"shipped {ship(Path(run_folder), model_name)}")
