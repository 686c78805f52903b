"""The records in Jupyter: the explorer page, registered from the renderer layer.

The records (``AttentionTrace``, what every trace function returns; ``ModelOutput``) are plain data
and import no renderer. Their notebook display lives here instead: ``register`` hands
IPython's HTML formatter one function per record type, by the type's module and name, so
that neither side imports the other. ``import selfattn`` calls it when IPython is running,
so a record at the end of a cell shows as the explorer, as it always has; ``explore``
gives the same page with other options (precision, a layer and head, a title, a height).
"""

from __future__ import annotations

import sys
from typing import Any, Callable

# (the record's module, its class name) -> the name of the explorer function that shows it
RECORD_PAGES = {
    ("selfattn.trace.record", "AttentionTrace"): "notebook_explorer",
    ("selfattn.models.model_output", "ModelOutput"): "notebook_model_explorer",
}


def _page_maker(record: Any) -> Callable[..., str]:
    """The explorer function for ``record``'s type; TypeError for anything else."""
    from selfattn.render.visual import explorer

    key = (type(record).__module__, type(record).__qualname__)
    if key not in RECORD_PAGES:
        known = ", ".join(name for _, name in RECORD_PAGES)
        raise TypeError(f"explore shows one of {known}; not a {type(record).__name__}")
    return getattr(explorer, RECORD_PAGES[key])


class Explorer:
    """A record's explorer page for a notebook: shows itself as an <iframe> (``_repr_html_``).

    Args:
        record: an ``AttentionTrace`` or a ``ModelOutput``.
        options: the explorer's keyword options (precision, title, layer, head, height).
    """

    def __init__(self, record: Any, **options: Any) -> None:
        self.record, self.options = record, options
        self.make = _page_maker(record)

    def _repr_html_(self) -> str:
        return self.make(self.record, **self.options)

    def html(self) -> str:
        """The <iframe> that the notebook shows."""
        return self._repr_html_()


def explore(record: Any, precision: int = 4, *, title: str | None = None, layer: int | None = None,
            head: int | None = None, height: int | None = None) -> Explorer:
    """The interactive explorer of a record, for a notebook cell.   record -> Explorer

    A record at the end of a cell already shows as its explorer once ``selfattn`` is
    imported in IPython; ``explore`` picks the precision, title, first layer and head, and
    the frame's height. A ``ModelOutput`` shows its first text, every layer and head
    (``layer`` and ``head`` do not apply to it).

    Args:
        record: an ``AttentionTrace`` (what ``build_trace`` and the trace functions return) or a ``ModelOutput``.
        precision: decimals shown, 0 to 10.
        title: the page's title; None: the default.
        layer: the layer selected first (0-based), for a model's trace.
        head: the head selected first (0-based).
        height: the frame's height in pixels; None fits it to the sentence.

    Returns:
        An ``Explorer``, which a notebook shows as the page.

    Raises:
        TypeError: record is not one of the records above.

    Examples:
        >>> import selfattn as sa
        >>> page = sa.explore(sa.build_trace(sa.ExplainConfig()), precision=2)
        >>> page.html().startswith("<iframe")
        True
    """
    options: dict[str, Any] = {"precision": precision, "title": title, "height": height}
    if (type(record).__module__, type(record).__qualname__) != ("selfattn.models.model_output", "ModelOutput"):
        options.update(layer=layer, head=head)
    return Explorer(record, **options)


def _show(record: Any) -> str:
    return _page_maker(record)(record)


def register(shell: Any = None) -> bool:
    """Show every record as its explorer in IPython (Jupyter): one HTML formatter per record type.

    Args:
        shell: the IPython shell; None: the running one, if any.

    Returns:
        True when the formatters were registered, False when no IPython shell runs.
    """
    if shell is None:
        ipython = sys.modules.get("IPython")
        shell = ipython.get_ipython() if ipython is not None else None
    if shell is None:
        return False
    formatter = shell.display_formatter.formatters["text/html"]
    for module, name in RECORD_PAGES:
        formatter.for_type_by_name(module, name, _show)
    return True
