"""Real-time Mode's Parquet sinks as a process of their own, at a lower CPU priority.

In Real-time Mode the online path (the Real-time query and the tile feed) sets the
freshness, and the micro-batch query beside it only keeps the offline store (raw
events, quarantine). In the same driver that query took both cores for 2-5 s every
``stream_realtime_offline_trigger_seconds`` (10 s then, 30 s now: validation,
deduplication and Parquet files of ~10,000 events), and the probes that fell in those bursts took
1-2 s instead of 0.1 (1,000 events/s on 2 cores). Linux shares the CPU between
threads by their nice value, not by Spark's scheduler pools, so that query now runs
as ``shopstream stream --offline-only`` in a process (and a JVM) of its own, niced by
``stream_realtime_offline_nice``: it gets every cycle the online path leaves, and
yields the cores when the online path needs them. Side by side on the same machine,
at 1,000 events/s: p99 3.0 s (max 4.0) in one driver, 0.83 s (max 0.96) split.

The child must stay in the parent's session. With the kernel's autogroup scheduling
(``/proc/sys/kernel/sched_autogroup_enabled``, on by default in most distributions)
every session is a scheduling group of its own, the groups share the CPU equally, and
a nice value only orders the threads within one group. Started in a session of its
own, the niced child took 55-70 % of the 2 cores while the Real-time feed beside it
was 8 s behind (top, 1,000 events/s): its nice value did nothing. So it gets a process
group of its own (a Ctrl-C in the terminal does not reach it), not a session.

The child stops with its parent: SIGTERM from the parent's stop (it finishes its
running micro-batch, as any ``shopstream stream`` does), and the kernel's parent-death
signal if the parent is killed (:func:`die_with_parent`), which it takes as the same
request, once. A supervisor may restart the parent while it finishes that batch: the new
sinks' process waits for it (:mod:`pipelines.checkpoint_lock`). Both queries keep their own
checkpoints, so a restart of either resumes where it left off.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import signal
import subprocess
import sys

from pipelines.settings import Settings

__all__ = ["OfflineSinksProcess", "OfflineSinksFailed", "die_with_parent", "lower_priority"]

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
PARENT_PID_ENV = "SHOPSTREAM_OFFLINE_PARENT_PID"
"""Set by :class:`OfflineSinksProcess` for its child: the pid it must outlive no longer."""


class OfflineSinksFailed(RuntimeError):
    """The Parquet sinks' process stopped on its own, with an error or unexpectedly."""


def lower_priority(settings: Settings) -> None:
    """Lower this process's CPU priority by ``stream_realtime_offline_nice`` (before Spark
    starts: the JVM's threads inherit it)."""
    if settings.stream_realtime_offline_nice:
        os.nice(settings.stream_realtime_offline_nice)


def die_with_parent() -> None:
    """Have the kernel signal this process when the parent that started it dies (a
    ``kill -9`` of the Real-time driver must not leave its Parquet sinks running):
    :data:`pipelines.signals.PARENT_DEATH_SIGNAL`, a stop request that its repeats do
    not turn into a stop at once.

    Linux only (``prctl``); elsewhere the child runs until it is stopped. Exits at once
    when the parent is already gone.
    """
    expected = os.environ.get(PARENT_PID_ENV)
    if not sys.platform.startswith("linux") or not expected:
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    from pipelines.signals import PARENT_DEATH_SIGNAL

    if libc.prctl(_PR_SET_PDEATHSIG, PARENT_DEATH_SIGNAL, 0, 0, 0) != 0:
        log.warning("could not ask for a signal on the parent's death (errno %d)",
                    ctypes.get_errno())
    if os.getppid() != int(expected):  # it died before the prctl
        raise SystemExit("the Real-time driver that started this process is gone")


class OfflineSinksProcess:
    """``shopstream stream --offline-only`` beside the Real-time query (module docstring)."""

    def __init__(self, settings: Settings, *, stop: str, idle_seconds: float,
                 snapshots: bool = True) -> None:
        self.settings = settings
        self.stop_mode = stop
        self.idle_seconds = idle_seconds
        self.snapshots = snapshots
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        args = [sys.executable, "-m", "pipelines.cli", "stream", "--offline-only"]
        if self.snapshots:  # the feature snapshots the feed asks for, off the online path
            args.append("--realtime-snapshots")
        if self.stop_mode == "available_now":
            args.append("--available-now")
        elif self.stop_mode == "idle":
            args += ["--until-idle", f"{self.idle_seconds:g}"]
        from pipelines.stream import trigger_seconds_of

        trigger = trigger_seconds_of(self.settings, realtime=True)
        env = self.settings.model_copy(update={
            "stream_mode": "microbatch", "stream_trigger_seconds": trigger}).child_env()
        env[PARENT_PID_ENV] = str(os.getpid())
        # its own process group, so a Ctrl-C in the terminal reaches the parent only, which
        # stops it with one SIGTERM (a second signal would stop it mid-batch); but the
        # parent's session, or its nice value would not count (module docstring)
        self._proc = subprocess.Popen(args, env=env, process_group=0)
        log.info("Parquet sinks: process %d (shopstream stream --offline-only%s, nice +%d, "
                 "trigger %ss)", self._proc.pid, " --realtime-snapshots" if self.snapshots else "",
                 self.settings.stream_realtime_offline_nice, trigger)

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def check(self) -> bool:
        """True once the process has ended cleanly; raises :class:`OfflineSinksFailed`
        when it failed."""
        code = self.returncode
        if code not in (None, 0):
            raise OfflineSinksFailed(f"the Parquet sinks' process (shopstream stream "
                                     f"--offline-only) exited with {code}; see its log above")
        return code == 0

    def stop(self, grace_seconds: float) -> None:
        """SIGTERM (it finishes its running micro-batch), then SIGKILL after ``grace_seconds``."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_seconds + 30)
        except subprocess.TimeoutExpired:
            log.warning("Parquet sinks: process %d still running after %.0f s; killing it "
                        "(its batch is replayed on the next start)", proc.pid, grace_seconds + 30)
            proc.kill()
            proc.wait()
