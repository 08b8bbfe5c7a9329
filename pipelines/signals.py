"""SIGTERM and SIGINT as a request to stop cleanly, for long-running jobs.

A process manager stops a service with SIGTERM (Kubernetes, ``systemctl stop``,
``kill``) and waits a grace period before SIGKILL; a user presses Ctrl-C. Python
dies at once on SIGTERM, and PySpark's own SIGINT handler cancels every running
Spark job: either way a streaming job would stop in the middle of a micro-batch.
That is safe (the checkpoint replays the batch) but wasteful, and the run's
summary, its last metrics and the background writes of the batch (top lists,
the Real-time feed's buffer) would not get done.

:class:`GracefulStop` turns the first signal into an event the job's wait loop
polls; the job then finishes its running batch and stops as it does at the end of
``--until-idle``; a producer stops sending and delivers what it already handed to
Kafka. A second signal raises ``KeyboardInterrupt`` at once, for a user who does
not want to wait. Signal handlers can only be installed from the main
thread; elsewhere (tests running a job in a thread) it does nothing.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType, TracebackType

__all__ = ["GracefulStop", "STOP_SIGNALS", "PARENT_DEATH_SIGNAL"]

log = logging.getLogger(__name__)

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)

PARENT_DEATH_SIGNAL = signal.SIGUSR1
"""What a child asks the kernel to send it when its parent dies (``PR_SET_PDEATHSIG``;
Real-time Mode's Parquet sinks' process, :mod:`pipelines.streaming.offline_process`).
A stop request like SIGTERM, but never a second one: the kernel sends it again each time
the child is handed to another thread of its dying parent (once per thread as a killed
process's threads exit), and as SIGTERM that repeat stopped the sinks mid-batch."""


_NAMES: dict[int, str] = {int(sig): sig.name for sig in (*STOP_SIGNALS, PARENT_DEATH_SIGNAL)}
"""Signal names, looked up without the ``enum`` machinery inside a handler."""


class GracefulStop:
    """Context manager: while active, the first SIGTERM/SIGINT sets :attr:`requested`.

    Parameters
    ----------
    what
        What is being stopped, for the log line (``"stream"``).
    finishing
        What it does before it stops, for the log line.
    """

    def __init__(self, what: str, finishing: str = "finishing the running batch") -> None:
        self.what = what
        self.finishing = finishing
        self.requested = threading.Event()
        self.signal_name: str | None = None
        self._previous: dict[signal.Signals, object] = {}

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for sig in (*STOP_SIGNALS, PARENT_DEATH_SIGNAL):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._restore()

    @property
    def installed(self) -> bool:
        """True when the handlers are in place (entered from the main thread)."""
        return bool(self._previous)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # A signal can interrupt this handler, and the kernel repeats the parent-death
        # signal in bursts: a nested call that reached ``requested.set()`` while the outer
        # one held the Event's lock inside it waited for that lock forever (the sinks'
        # process hung after its driver was killed). So the first statement marks the stop
        # with a plain attribute, and only the call that marked it sets the Event.
        name = "parent died" if signum == PARENT_DEATH_SIGNAL else _NAMES[signum]
        first, self.signal_name = self.signal_name is None, self.signal_name or name
        if signum == PARENT_DEATH_SIGNAL:  # once, however often the kernel repeats it
            if first:
                self.requested.set()
                log.info("%s: the process that started it died: %s, then stopping",
                         self.what, self.finishing)
            return
        if not first:
            log.warning("%s: %s again: stopping at once (an unfinished batch is replayed on restart)",
                        self.what, _NAMES[signum])
            self._restore()
            raise KeyboardInterrupt
        self.requested.set()
        log.info("%s: %s received: %s, then stopping (send it again to stop at once)",
                 self.what, self.signal_name, self.finishing)

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()
