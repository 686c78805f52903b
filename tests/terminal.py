"""Run the CLI with a pseudo-terminal as its stdin, stdout and stderr, as a user's shell would."""

from __future__ import annotations

import os
import pty
import select
import sys


def run_in_terminal(*argv: str, timeout: float = 120) -> tuple[int, str]:
    """(exit code, everything the command printed) for ``python -m selfattn ARGV`` under a pty."""
    pid, fd = pty.fork()
    if pid == 0:  # child: the terminal is its stdin, stdout and stderr
        os.execv(sys.executable, [sys.executable, "-m", "selfattn", *argv])
    chunks = []
    while select.select([fd], [], [], timeout)[0]:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), b"".join(chunks).decode("utf-8", "replace")
