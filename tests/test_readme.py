"""The README's examples run as written: its Python blocks and every `selfattn` command it shows."""

import re
import shlex
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_python_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert len(blocks) >= 2
    namespace: dict = {}
    exec(compile("\n".join(blocks), "README.md", "exec"), namespace)  # noqa: S102 - our own README
    assert namespace["out"].last_hidden_state.shape == (2, 10, 64)
    assert namespace["w"].shape == (2, 8, 10, 10)
    assert namespace["emb"].shape == (2, 384)  # the MiniLM example


SHELL = "\n".join(re.findall(r"```sh\n(.*?)```", README, re.S))
INLINE = re.findall(r"`(selfattn explain[^`]*)`", README)  # the variants table
COMMANDS = sorted(
    {
        command.split("#")[0].strip()
        for command in re.findall(r"^selfattn explain.*$", SHELL, re.M) + INLINE
        if ">" not in command and "table.json" not in command  # writes a file / needs one
    }
)


@pytest.mark.parametrize("command", COMMANDS)
def test_explain_commands_in_the_readme_run(run_cli, command):
    assert len(COMMANDS) >= 10
    status, out, err = run_cli(*shlex.split(command)[1:])
    assert status == 0 and out and err == "", (command, err)


PICTURES = sorted(
    command
    for command in set(re.findall(r"`(selfattn (?:plot|view) [^`]*)`", README))
    | {c.split("#")[0].strip() for c in re.findall(r"^selfattn (?:plot|view) .*$", SHELL, re.M)}
    if "FILE" not in command and "[" not in command  # usage lines, not examples
)
MODEL_COMMANDS = sorted({c.split("#")[0].strip() for c in re.findall(r"^selfattn (?:heads|similarity).*$", SHELL, re.M)})


@pytest.mark.parametrize("command", MODEL_COMMANDS)
def test_heads_and_similarity_commands_in_the_readme_run(run_cli, command):
    assert len(MODEL_COMMANDS) >= 2
    status, out, err = run_cli(*shlex.split(command)[1:])
    assert status == 0 and out and err == "", (command, err)


@pytest.mark.parametrize("command", PICTURES)
def test_plot_and_view_commands_in_the_readme_run(run_cli, tmp_path, command):
    assert len(PICTURES) >= 5
    args = shlex.split(command)[1:]
    output = tmp_path / Path(args[args.index("-o") + 1]).name
    args[args.index("-o") + 1] = str(output)
    status, out, err = run_cli(*args)
    assert status == 0 and err == "" and output.stat().st_size > 1000, (command, err)


def test_ring_attention_example_runs_under_torchrun(tmp_path):
    """The README's ring example, as a script on 2 gloo ranks, checked against SDPA on the full sequence."""
    import os
    import subprocess
    import sys

    (block,) = re.findall(r"```python torchrun\n(.*?)```", README, re.S)
    check = (
        "\nimport torch.nn.functional as F\n"
        "torch.manual_seed(0)\n"
        "fq, fk, fv = (torch.randn(1, 8, 4096, 64) for _ in range(3))\n"
        "torch.testing.assert_close(full, F.scaled_dot_product_attention(fq, fk, fv, is_causal=True), atol=1e-5, rtol=1e-5)\n"
        "print('rank', positions, 'ok')\n"
    )
    script = tmp_path / "my_script.py"
    script.write_text(block.replace("dist.destroy_process_group()", "") + check)
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node=2", str(script)],
                          capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("ok") == 2
