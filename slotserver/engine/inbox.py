"""The engine's inbox: what client threads ask of the engine thread, handled between two steps.

Clients (the server's event loop, the lab, slot files) never touch the scheduler: `submit`,
`cancel` and `call` leave a message here, and the engine thread drains it at the start of its next
step. Why apart from the engine: the messages and what each does (queue a sequence, compiling its
grammar first; finish a cancelled one; run a function on the engine thread) are one idea, and the
in-flight count that bounds the queue (`EngineBusy`) is theirs.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future

from slotserver.engine.grammar import GrammarError
from slotserver.engine.postprocess import final_event
from slotserver.engine.request import EngineBusy, ErrorEvent
from slotserver.engine.sequence import Sequence


class Inbox:
    def __init__(self, sched, grammars, limit: int, wake: threading.Event) -> None:
        self.sched, self.grammars, self.limit, self._wake = sched, grammars, limit, wake
        self._messages: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self.in_flight = 0

    # -- any thread ------------------------------------------------------------------------------
    def take(self) -> None:
        """Count a new request in flight; EngineBusy when the slots and the queue are full."""
        with self._lock:
            if self.in_flight >= self.limit:
                raise EngineBusy(f"server is busy: {self.in_flight} requests in flight, queue full")
            self.in_flight += 1

    def release(self, n: int) -> None:
        with self._lock:
            self.in_flight -= n

    def post(self, message: tuple) -> None:
        self._messages.put(message)
        self._wake.set()

    # -- the engine thread -------------------------------------------------------------------------
    def pending(self) -> bool:
        """Whether a client message waits (a sleeping engine wakes for it before draining)."""
        return not self._messages.empty()

    def drain(self) -> None:
        while True:
            try:
                msg = self._messages.get_nowait()
            except queue.Empty:
                return
            if msg[0] == "submit":
                self._admit(msg[1])
            elif msg[0] == "cancel":
                self._cancel(msg[1])
            elif msg[0] == "call":
                _run_call(msg[1], msg[2])

    def _admit(self, seq: Sequence) -> None:
        """Queue a submitted sequence; a constrained one gets its grammar matcher here, on the
        engine thread (a large schema takes milliseconds to compile: never on the event loop)."""
        if seq.request.grammar is not None:
            try:
                seq.grammar = self.grammars.matcher(seq.request.grammar)
            except GrammarError as e:
                seq.finished = True
                seq.handle.emit(ErrorEvent(str(e)))
                self.release(1)
                return
        self.sched.add(seq)

    def _cancel(self, request_id: int) -> None:
        for seq in list(self.sched.waiting) + self.sched.running():
            if seq.id == request_id and not seq.finished:
                self.sched.finish(seq)
                seq.handle.emit(final_event(seq, "none"))
                self.release(1)

    def fail_running(self, message: str) -> None:
        """A step failed: every running request gets `message` as its error (the server lives on)."""
        for seq in self.sched.running():
            self.sched.finish(seq)
            seq.handle.emit(ErrorEvent(message))
            self.release(1)


def _run_call(fn, fut: Future) -> None:
    if not fut.set_running_or_notify_cancel():
        return
    try:
        fut.set_result(fn())
    except BaseException as e:  # noqa: BLE001 - handed to the caller
        fut.set_exception(e)
