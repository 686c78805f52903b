"""Start the live app: bind the address, say it, open the browser, serve until Ctrl-C.

The models and the server are imported when it starts: the command line checks --port
and the --model names with this module before torch loads.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import webbrowser
from collections.abc import Sequence
from typing import TextIO

from selfattn.errors import OptionError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def check_port(port: int) -> None:
    """OptionError unless ``port`` is a whole number from 0 (a free one) to 65535."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise OptionError(f"--port must be a whole number from 0 to 65535, got {port!r}")


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: a free one), or an ``OptionError`` saying why not."""
    check_port(port)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise OptionError(f"--host {host!r} is not an address this machine can listen on ({error.strerror})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as error:
        sock.close()
        raise OptionError(f"cannot listen on {host}:{port}: {error.strerror or error} (try another --port)") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def address_of(sock: socket.socket, host: str) -> str:
    port = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


def opens_browser(asked: bool, out: TextIO, environ=None, platform: str | None = None) -> bool:
    """Whether to open the page: asked, in a terminal, and where a window can open.

    On Linux and the BSDs that needs a display (DISPLAY or WAYLAND_DISPLAY): without one
    Python's ``webbrowser`` falls back to a text browser, which would take over the very
    terminal the server prints to.
    """
    environ = os.environ if environ is None else environ
    platform = sys.platform if platform is None else platform
    if not (asked and out.isatty() and sys.stdin.isatty()):
        return False
    return platform in ("darwin", "win32") or bool(environ.get("DISPLAY") or environ.get("WAYLAND_DISPLAY"))


def _open(url: str) -> None:
    try:
        webbrowser.open(url)
    except Exception:  # noqa: BLE001 - the address is printed; a browser that fails to start changes nothing
        pass


def serve(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, models: Sequence[str] = (), browser: bool = True,
          stream: TextIO | None = None) -> int:
    """Run the live app until interrupted; returns the exit status (0 after Ctrl-C).

    Args:
        host: the address to bind; anything but the local machine is said out loud.
        port: the port (0: a free one, printed).
        models: extra models to offer besides the built-in ones (names, folders, checkpoints).
        browser: open the page in the browser when there is a terminal.
        stream: where the address and notes go (None: stdout).

    Raises:
        OptionError: the address cannot be bound.
        ModelError: an extra model cannot be resolved.
    """
    import uvicorn

    from selfattn.commands.live import LiveModels
    from selfattn.serve.app import create_app
    from selfattn.serve.guard import allowed_hosts

    out = sys.stdout if stream is None else stream
    offered = LiveModels(models)
    sock = bind(host, port)
    url = address_of(sock, host)
    print(f"selfattn serve: {url}  (Ctrl-C stops it)", file=out)
    print(f"models: {', '.join(offered.names)} (each loads when first used)", file=out)
    hosts = allowed_hosts(host, sock.getsockname()[1])
    if host not in LOCAL_HOSTS:
        print(f"note: listening on {host}, not only this machine: anyone who can reach it can use the app", file=out)
        print(f"it answers requests addressed to {', '.join(sorted(hosts))}", file=out)
    out.flush()
    config = uvicorn.Config(create_app(offered, hosts), log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    if opens_browser(browser, out):
        threading.Timer(0.5, _open, args=(url,)).start()
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
    print("selfattn serve: stopped", file=out)
    return 0
