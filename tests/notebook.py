"""What Jupyter shows for a record: IPython's own display formatter, as a notebook calls it."""

from __future__ import annotations

import pytest

pytest.importorskip("IPython", reason="IPython is a test tool: pip install -e '.[dev]'")

from IPython.core.interactiveshell import InteractiveShell  # noqa: E402

from selfattn.render.visual.notebook import register  # noqa: E402


def shown_in_jupyter(record) -> str:
    """The text/html IPython shows for ``record`` once selfattn's display is registered (as ``import selfattn`` does in IPython)."""
    shell = InteractiveShell.instance()
    assert register(shell)
    data, _ = shell.display_formatter.format(record)
    return data["text/html"]
