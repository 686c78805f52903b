"""The live app's page (``selfattn serve``): plain HTML, CSS and JavaScript shipped in ``assets/``.

The page asks its own server for every number (the JSON API of ``commands.live``) and
computes no attention itself. Its Content-Security-Policy allows nothing but its own
origin: no CDN, no remote font, no other host. Its script is a set of ES modules: live.js,
the entry, imports the other live-*.js by relative path.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

# Scripts, styles, frames (the explorer) and requests from the page's own origin only.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
CSS, JAVASCRIPT = "text/css; charset=utf-8", "text/javascript; charset=utf-8"
# The page's script, as ES modules: live.js, the entry, imports the others by relative path.
SCRIPTS = ("live.js", "live-common.js", "live-models.js", "live-walk.js", "live-attention.js",
           "live-attention-grid.js", "live-arrows.js", "live-generate.js", "live-tokens.js", "live-cache.js",
           "live-ablate.js", "live-chat.js")
# Every file the page loads; GET /assets/{name} serves these names and no other. palette.css
# holds the colours the explorer pages share.
ASSET_TYPES = {"palette.css": CSS, "live.css": CSS, **{name: JAVASCRIPT for name in SCRIPTS}}


@lru_cache(maxsize=None)
def live_asset(name: str) -> str:
    """One of the page's assets (``ASSET_TYPES``' names), as text."""
    if name not in ASSET_TYPES and name != "live.html":
        raise KeyError(name)
    return resources.files("selfattn.render.visual").joinpath("assets", name).read_text(encoding="utf-8")


def live_page() -> str:
    """The page itself; it loads /assets/live.css and /assets/live.js (a module that imports the
    other live-*.js) from the same server."""
    return live_asset("live.html")
