"""A run's folder: what is in it, checking it before a run, reading it after.

    DIR/config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
        generation_config.json      the checkpoint, GPT-2's Hugging Face layout
    DIR/training.json               the settings, the vocabulary, the attention path, where the run is
    DIR/metrics.jsonl               one JSON object per logged step
    DIR/probe.json                  the fixed probe: ids, tokens, repeat length, offset
    DIR/probe/step-NNNNNN.safetensors   the probe's attention at that step (training.probe)
    DIR/train_state.pt              what --resume needs: the optimiser's state and the step

Every file is written whole or not at all (a temporary name, then a rename), so an
interrupted run keeps its last checkpoint intact.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from selfattn.errors import TrainingError

SETTINGS, METRICS, PROBE, STATE = "training.json", "metrics.jsonl", "probe.json", "train_state.pt"


def check_new_run_folder(folder: Path, create: bool = True) -> None:
    """A folder a new run may write: absent (made when ``create``), or empty, and writable.

    Raises:
        TrainingError: it is a file, holds another run or other files, or cannot be written.
    """
    if folder.exists() and not folder.is_dir():
        raise TrainingError(f"the output {folder} is a file, not a folder")
    if (folder / SETTINGS).is_file():
        settings = read_settings(folder)
        raise TrainingError(
            f"{folder} holds another run ({settings.get('config', {}).get('task', '?')}, step "
            f"{settings.get('step', '?')} of {settings.get('config', {}).get('steps', '?')}): give another --out, "
            f"or --resume to continue it"
        )
    if folder.is_dir() and any(folder.iterdir()):
        raise TrainingError(f"the output folder {folder} is not empty: give a new or empty folder")
    existing = folder if folder.is_dir() else next((p for p in folder.absolute().parents if p.exists()), None)
    if existing is None or not os.access(existing, os.W_OK | os.X_OK):
        raise TrainingError(f"cannot write the output folder {folder}: permission denied")
    if create:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise TrainingError(f"cannot make the output folder {folder}: {error.strerror or error}") from None


def check_resume_folder(folder: Path) -> dict:
    """The settings of the run to resume in ``folder``.

    Raises:
        TrainingError: there is no run there, or it saved no checkpoint to resume from.
    """
    if not (folder / SETTINGS).is_file():
        raise TrainingError(f"there is no run to resume in {folder} (no {SETTINGS}): start one without --resume")
    if not (folder / STATE).is_file():
        raise TrainingError(f"the run in {folder} saved no checkpoint yet ({STATE} is missing): start it again")
    if not os.access(folder, os.W_OK):
        raise TrainingError(f"cannot write the output folder {folder}")
    return read_settings(folder)


def read_settings(folder: Path) -> dict:
    """training.json of a run.   Raises TrainingError when it is unreadable."""
    try:
        return json.loads((Path(folder) / SETTINGS).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise TrainingError(f"cannot read {Path(folder) / SETTINGS}: {error}") from None


def read_metrics(folder) -> list[dict]:
    """metrics.jsonl of a run: one dict per logged step, in order.

    Args:
        folder: the run's folder.

    Returns:
        The records (step, train_loss, val_loss, lr, tokens_per_s, heads, ...).

    Raises:
        TrainingError: the folder holds no run or the file is unreadable.
    """
    path = Path(folder) / METRICS
    if not path.is_file():
        raise TrainingError(f"{folder} holds no training run ({METRICS} is missing)")
    try:
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, ValueError) as error:
        raise TrainingError(f"cannot read {path}: {error}") from None
    records = []
    for number, line in enumerate(lines):
        try:
            records.append(json.loads(line))
        except ValueError:
            if number == len(lines) - 1:  # a run still writing its last line
                break
            raise TrainingError(f"{path} line {number + 1} is not JSON") from None
    return records


def keep_metrics_until(folder: Path, step: int) -> None:
    """Drop metrics lines after ``step`` (a resumed run logs them again)."""
    path = folder / METRICS
    if path.is_file():
        kept = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip() and json.loads(line)["step"] <= step]
        write_whole(path, "".join(line + "\n" for line in kept))


def append_metrics(folder: Path, record: dict) -> None:
    """One line more in metrics.jsonl, written in one call (a reader skips a half-written last line)."""
    with open(folder / METRICS, "a", encoding="utf-8") as stream:
        stream.write(json.dumps(record) + "\n")


def write_whole(path: Path, text: str) -> None:
    """``text`` into ``path`` through a temporary name and a rename."""
    temporary = path.with_name(path.name + ".partial")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def write_settings(folder: Path, settings: dict) -> None:
    """training.json, whole."""
    write_whole(folder / SETTINGS, json.dumps(settings, indent=2) + "\n")
