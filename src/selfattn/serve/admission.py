"""Bounded work in the live app: how many requests compute at once, how many wait, and when to refuse.

Each model has two gates, and the seed's walkthrough (no model) one of its own:

    generations   /api/generate               1 at a time, 3 waiting
    work          /api/attention, /api/explain, /explorer   1 at a time, 8 waiting

A request past a gate's queue is refused at once with 503, one JSON line and a
``Retry-After`` header (whole seconds: about how long the queue ahead takes to clear, from
how long recent requests held the gate). Waiting costs no thread: a request waits in the
event loop, and only the ones let in compute in the thread pool.

A generation holds its place until its answer has been sent, or its client has gone: then
it is told to stop (``LiveGeneration.stop``), which it does at its next token, and the next
request in the queue goes in. ``Held`` is the streamed answer that does this; ``until_done``
watches the connection while a generation runs before its answer starts.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.responses import StreamingResponse

from selfattn.commands.live import RequestError

GENERATIONS_RUNNING, GENERATIONS_WAITING = 1, 3
WORK_RUNNING, WORK_WAITING = 1, 8
FIRST_GUESS = 1.0  # seconds a request holds a gate, until some have been timed
MAX_RETRY_AFTER = 60


class Busy(RequestError):
    """A request past a gate's queue: 503, and ``retry_after`` whole seconds to wait before trying again."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message, 503)
        self.retry_after = retry_after


class Place:
    """A request's place at a gate: ``leave`` (once; more calls do nothing) lets the next one in."""

    def __init__(self, gate: Gate) -> None:
        self._gate, self._since, self._left = gate, time.monotonic(), False

    def leave(self) -> None:
        if not self._left:
            self._left = True
            self._gate._leave(time.monotonic() - self._since)


class Gate:
    """At most ``running`` requests inside and ``waiting`` queued, in order of arrival; past that, ``Busy``.

    ``enter`` is awaited in an event loop; ``leave`` may be called from any thread.
    """

    def __init__(self, what: str, unit: str, running: int, waiting: int) -> None:
        self.what, self.unit, self.running, self.waiting = what, unit, running, waiting
        self._inside = 0
        self._queue: deque[asyncio.Future] = deque()
        self._held = FIRST_GUESS  # a moving average of how long a request stays inside
        self._lock = threading.Lock()

    async def enter(self) -> Place:
        """A place inside, at once or after the requests queued before it; ``Busy`` when the queue is full."""
        with self._lock:
            if self._inside < self.running and not self._queue:
                self._inside += 1
                return Place(self)
            if len(self._queue) >= self.waiting:
                raise Busy(f"{self.what} is busy: {self._inside} {self.unit} running and {len(self._queue)} waiting, "
                           f"as many as it queues; try again in {self.retry_after()} s", self.retry_after())
            turn = asyncio.get_running_loop().create_future()
            self._queue.append(turn)
        try:
            await turn  # done when a leaving request hands its place over
        except asyncio.CancelledError:
            with self._lock:
                if turn in self._queue:
                    self._queue.remove(turn)
                    raise
            if turn.done() and not turn.cancelled():  # handed over just before: pass it on
                self._leave(None)
            raise  # (handed over but cancelled first: _hand_over passes it on)
        return Place(self)

    def retry_after(self) -> int:
        """Whole seconds until the queue ahead has likely cleared, from 1 to ``MAX_RETRY_AFTER``."""
        ahead = (self._inside + len(self._queue)) / self.running
        return max(1, min(MAX_RETRY_AFTER, math.ceil(self._held * ahead)))

    def _leave(self, seconds: float | None) -> None:
        """A place is free: hand it to the oldest waiting request, or count it empty. ``seconds``: how
        long it was held (None: it was handed on unused)."""
        with self._lock:
            if seconds is not None:
                self._held = 0.8 * self._held + 0.2 * seconds
            while self._queue:  # the place goes to the oldest waiting request: _inside stays
                turn = self._queue.popleft()
                try:
                    turn.get_loop().call_soon_threadsafe(self._hand_over, turn)
                    return
                except RuntimeError:  # its event loop has closed: the next one
                    continue
            self._inside -= 1

    def _hand_over(self, turn: asyncio.Future) -> None:
        if turn.cancelled():
            self._leave(None)  # its request gave up meanwhile: the next in line
        else:
            turn.set_result(None)


class Gates:
    """One ``Gate`` per key (a model's name; "" for the seed's walkthrough), made on first use.

    unit: what one request is, in the refusal ("generation", "request").
    """

    def __init__(self, unit: str, running: int, waiting: int) -> None:
        self.unit, self.running, self.waiting = unit, running, waiting
        self._gates: dict[str, Gate] = {}

    def of(self, key: str) -> Gate:
        if key not in self._gates:
            self._gates[key] = Gate(key or "the walkthrough (no model)", self.unit, self.running, self.waiting)
        return self._gates[key]


async def until_done(receive, stop: Callable[[], None], work: Callable[[], Any]) -> Any:
    """``work()`` in the thread pool; if the client disconnects meanwhile, ``stop()`` is called.

    receive: the request's ASGI ``receive``, its body already read, so that the next message
    it gives is the disconnect.
    """
    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        stop()

    watcher = asyncio.ensure_future(watch())
    try:
        return await run_in_threadpool(work)
    finally:
        watcher.cancel()


class Held(StreamingResponse):
    """A streamed answer that keeps its request's place at a gate until the last byte is sent or
    the client has gone; then (either way) ``stop`` is called and the place is left."""

    def __init__(self, content, place: Place, stop: Callable[[], None], media_type: str) -> None:
        super().__init__(content, media_type=media_type)
        self._place, self._stop = place, stop

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._stop()
            self._place.leave()
