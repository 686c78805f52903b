"""A real ``selfattn serve --port 0 --no-browser`` on 127.0.0.1, started as a user starts it.

The browser, guard and load tests, bench/live.py and docs/make_live_screenshots.py all
talk to the server this way:

    with live_server() as server:      # waits for the address line (torch imports first)
        server.url                     # 'http://127.0.0.1:PORT/'
        server.port, server.pid
    # stopped with SIGINT (Ctrl-C); ServerFailed if it did not start, did not stop,
    # exited with a status other than 0 or wrote a traceback

Its stderr goes to a temporary file, not a pipe, so a chatty server can never block on a
full pipe while nobody reads it.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

FIRST_LINE = re.compile(r"selfattn serve: (http://127\.0\.0\.1:(\d+)/)  \(Ctrl-C stops it\)$")
START_TIMEOUT = 90  # seconds to the address line (the first run imports torch and FastAPI)
STOP_TIMEOUT = 15  # seconds from SIGINT to exit


class ServerFailed(RuntimeError):
    """The server did not start, did not stop, or stopped badly; the message ends with its stderr."""


@dataclass
class LiveServer:
    url: str  # 'http://127.0.0.1:PORT/'
    port: int
    pid: int
    errors: str = ""  # its stderr, once stopped


def _first_line(process: subprocess.Popen, timeout: float) -> str:
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    try:
        ready = selector.select(timeout)
    finally:
        selector.close()
    return process.stdout.readline() if ready else ""


def _stderr(log) -> str:
    log.seek(0)
    return log.read()


@contextmanager
def live_server(*args: str, timeout: float = START_TIMEOUT) -> Iterator[LiveServer]:
    """``selfattn serve --port 0 --no-browser [args]`` until the block ends; see the module docstring."""
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "selfattn", "serve", "--port", "0", "--no-browser", *args],
            stdout=subprocess.PIPE, stderr=log, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        line = _first_line(process, timeout)
        match = FIRST_LINE.match(line.rstrip("\n"))
        if not match:
            process.kill()
            process.wait()
            said = f"printed {line!r}" if line else f"printed nothing in {timeout} s"
            raise ServerFailed(f"selfattn serve {said}: {_stderr(log)[-3000:]}")
        server = LiveServer(url=match.group(1), port=int(match.group(2)), pid=process.pid)
        try:
            yield server
        finally:
            process.send_signal(signal.SIGINT)
            try:
                status = process.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                status = None
            process.stdout.close()
            server.errors = _stderr(log)
        if status is None:
            raise ServerFailed(f"selfattn serve did not stop within {STOP_TIMEOUT} s of SIGINT: {server.errors[-3000:]}")
        if status != 0 or "Traceback" in server.errors:
            raise ServerFailed(f"selfattn serve exited with {status}: {server.errors[-3000:]}")
