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

On a machine the online path fills, a niced process gets next to nothing: the CFS
weight of nice +19 is 15 against 1,024 at nice 0. On the slowest machine seen, at 1,000
and 2,000 events/s, a JVM started at nice +19 had not started its query after 300 s (its
heartbeater, run before its block manager had registered, logged Spark's
``NullPointerException ... "idWithoutTopologyInfo" is null``), so the offline store stood
still while Kafka's retention ran on. So the process starts at the driver's priority: its
JVM's start, its first batches' code compiled, and the backlog since the last run, take
the CPU they need. Once its query has caught up with the topic (a batch read all there
was in no longer than its trigger, or it found nothing: each event of its query writes a pulse file that says which,
:func:`pulse_from_env`), the driver nices every thread of it and of its JVM by
``stream_realtime_offline_nice`` (:meth:`OfflineSinksProcess.check`); an unprivileged
process may always raise the nice value of its own processes. Should the niced process
then go ``stream_realtime_offline_stall_seconds`` without catching up, the driver gives
it its own priority back for the rest of the run: in place where it may lower a nice value
(``CAP_SYS_NICE``: root, or a container granted it), which keeps the JVM it has warmed
up; else by stopping it and starting it again. On such a machine the offline store then
keeps up, and the online path's freshness pays for it.
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
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pipelines.settings import Settings

__all__ = ["OfflineSinksProcess", "OfflineSinksFailed", "die_with_parent", "lower_priority",
           "pulse_from_env"]

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
PARENT_PID_ENV = "SHOPSTREAM_OFFLINE_PARENT_PID"
"""Set by :class:`OfflineSinksProcess` for its child: the pid it must outlive no longer."""
PULSE_FILE_ENV = "SHOPSTREAM_OFFLINE_PULSE_FILE"
"""Set by :class:`OfflineSinksProcess` for its child: the file each event of its query touches."""
_STOPPED_EXITS = (0, 130, -signal.SIGKILL)
"""How a child stopped by :meth:`OfflineSinksProcess.stop` may end without having failed:
finished its batch (0); the SIGTERM came before its query had started, while its signal
handlers were not in place yet, and ended it as a Ctrl-C does (130); killed after the
grace period. Its checkpoint replays whatever it had not committed."""


class OfflineSinksFailed(RuntimeError):
    """The Parquet sinks' process stopped on its own, with an error or unexpectedly."""


def lower_priority(settings: Settings) -> None:
    """Lower this process's CPU priority by ``stream_realtime_offline_nice`` (before Spark
    starts: the JVM's threads inherit it): for a ``--offline-only`` started by hand. The
    Real-time driver passes 0 and nices its child itself once caught up."""
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


CAUGHT_UP = b"caught-up\n"
"""A pulse's content when its query event found the query caught up with the topic."""
BEHIND = b"behind\n"
"""A pulse's content when the event's batch left input for later (``maxOffsetsPerTrigger``)."""


def caught_up_within(progress: Mapping[str, Any] | None, trigger_seconds: float) -> bool:
    """Whether a query event of the sinks' process shows it caught up with the topic: an
    idle report (``None``), or a batch that read all there was (``caught_up_of``; a source
    that does not say counts) in no longer than its trigger, so the next batch starts on
    time. A first batch at the driver's priority took 51 s of a 30 s trigger on a full
    machine, with 50,000 events come meanwhile: read all there was, and still behind."""
    from pipelines.stream_metrics import caught_up_of

    if progress is None:
        return True
    took_ms = float((progress.get("durationMs") or {}).get("triggerExecution") or 0)
    return caught_up_of(progress) is not False and took_ms <= trigger_seconds * 1000


def staged_pulse(pulse: Path) -> Path:
    """Where a pulse is written before it is renamed into place, whole."""
    return pulse.with_name(pulse.name + ".tmp")


def pulse_from_env(trigger_seconds: float) -> Callable[[Mapping[str, Any] | None], None] | None:
    """In the sinks' process, what its query's listener calls on each event (its progress,
    ``None`` when idle): write the pulse file its driver watches, saying whether the query
    has caught up (:func:`caught_up_within`, module docstring). ``None`` in any other
    process."""
    path = os.environ.get(PULSE_FILE_ENV)
    if not path:
        return None
    pulse = Path(path)
    staged = staged_pulse(pulse)

    def beat(progress: Mapping[str, Any] | None) -> None:
        caught_up = caught_up_within(progress, trigger_seconds)
        with contextlib.suppress(OSError):  # the driver takes it for stalled: never fail the query
            staged.write_bytes(CAUGHT_UP if caught_up else BEHIND)
            os.replace(staged, pulse)  # whole: the driver never reads half a pulse

    return beat


def read_pulse(path: Path) -> tuple[float, bool] | None:
    """The last pulse's time and whether it said caught up; ``None`` when there is none."""
    try:
        with path.open("rb") as pulse:
            return os.fstat(pulse.fileno()).st_mtime, pulse.read() == CAUGHT_UP
    except OSError:
        return None


def stalled_for(now: float, started: float, last_pulse: float | None) -> float:
    """Seconds since the sinks' process last showed it had caught up: since that pulse, or
    since ``started`` (its start, or when it was niced) when it has sent none since (an
    earlier pulse does not count)."""
    last = started if last_pulse is None or last_pulse < started else last_pulse
    return max(now - last, 0.0)


def descendants(pid: int) -> list[int]:
    """The processes under ``pid`` (children, theirs, ...), from ``/proc``: the sinks'
    process starts its JVM as a child of its own."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class OfflineSinksProcess:
    """``shopstream stream --offline-only`` beside the Real-time query (module docstring)."""

    def __init__(self, settings: Settings, *, stop: str, idle_seconds: float,
                 snapshots: bool = True) -> None:
        self.settings = settings
        self.stop_mode = stop
        self.idle_seconds = idle_seconds
        self.snapshots = snapshots
        self.nice = self._driver_nice()
        """The child's nice value now: the driver's until its query has caught up, then
        ``stream_realtime_offline_nice`` more, the driver's again once a stall gave it that."""
        self.escalations = 0
        """How often a stall gave it the driver's priority (in place, or by a restart)."""
        self.escalation_why = ""
        """Why the last time: for ``shopstream status``."""
        self._proc: subprocess.Popen[bytes] | None = None
        self._stopping = False
        self._started_at = 0.0
        self._yielded_at: float | None = None
        self._caught_up_at: float | None = None
        self.pulse_path = settings.run_path / f"offline-sinks.{os.getpid()}.pulse"

    def _command(self) -> list[str]:
        """The child's command line (a test runs another program in its place)."""
        args = [sys.executable, "-m", "pipelines.cli", "stream", "--offline-only"]
        if self.snapshots:  # the feature snapshots the feed asks for, off the online path
            args.append("--realtime-snapshots")
        if self.stop_mode == "available_now":
            args.append("--available-now")
        elif self.stop_mode == "idle":
            args += ["--until-idle", f"{self.idle_seconds:g}"]
        return args

    def _remove_dead_drivers_pulses(self) -> None:
        """A driver killed with SIGKILL leaves its pulse file behind: remove those whose
        driver is gone (the pid in the name)."""
        for path in self.pulse_path.parent.glob("offline-sinks.*.pulse*"):
            try:
                os.kill(int(path.name.split(".")[1]), 0)
            except ValueError:
                continue  # not one of ours
            except ProcessLookupError:
                with contextlib.suppress(OSError):
                    path.unlink()
            except PermissionError:
                pass  # alive, another user's

    def start(self) -> None:
        from pipelines.stream import trigger_seconds_of

        trigger = trigger_seconds_of(self.settings, realtime=True)
        # it starts at the driver's priority and is niced once caught up (_watch)
        env = self.settings.model_copy(update={
            "stream_mode": "microbatch", "stream_trigger_seconds": trigger,
            "stream_realtime_offline_nice": 0}).child_env()
        env[PARENT_PID_ENV] = str(os.getpid())
        self.pulse_path.parent.mkdir(parents=True, exist_ok=True)
        if self._proc is None:
            self._remove_dead_drivers_pulses()
        env[PULSE_FILE_ENV] = str(self.pulse_path)
        self._stopping = False
        self._started_at = time.time()
        self._yielded_at = self._caught_up_at = None
        self.nice = self._driver_nice()
        # its own process group, so a Ctrl-C in the terminal reaches the parent only, which
        # stops it with one SIGTERM (a second signal would stop it mid-batch); but the
        # parent's session, or its nice value would not count (module docstring)
        self._proc = subprocess.Popen(self._command(), env=env, process_group=0)
        log.info("Parquet sinks: process %d (shopstream stream --offline-only%s, trigger %ss), "
                 "at the driver's priority until it has caught up with the topic%s",
                 self._proc.pid, " --realtime-snapshots" if self.snapshots else "", trigger,
                 "" if self.escalations else f", then nice +{self._yield_nice()}")

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def check(self) -> bool:
        """True once the process has ended cleanly (by itself, or as :meth:`stop` asked);
        raises :class:`OfflineSinksFailed` when it failed. While it runs, nices it once its
        query has caught up, and gives it the driver's priority back once it has stalled
        (module docstring)."""
        if self._proc is None:
            return False  # not started
        code = self.returncode
        if code is None:
            self._watch()
            return False
        if code == 0 or (self._stopping and code in _STOPPED_EXITS):
            return True
        raise OfflineSinksFailed(f"the Parquet sinks' process (shopstream stream "
                                 f"--offline-only) exited with {code}; see its log above")

    def _yield_nice(self) -> int:
        """The nice value it runs at once caught up: ``stream_realtime_offline_nice`` above
        the driver's."""
        return min(self._driver_nice() + self.settings.stream_realtime_offline_nice, 19)

    def _watch(self) -> None:
        if self.escalations:
            return  # at the driver's priority for the rest of this run: nothing more to decide
        pulse = read_pulse(self.pulse_path)
        if pulse is not None and pulse[1] and pulse[0] >= self._started_at:
            self._caught_up_at = pulse[0]
        if self._yielded_at is None:
            if self._caught_up_at is not None:
                self._yield()
            return
        self._escalate_if_stalled()

    def _yield(self) -> None:
        """Its query has caught up, its JVM has started and compiled its hot code: from now on
        it takes only the cycles the online path leaves."""
        self._yielded_at = time.time()
        target = self._yield_nice()
        if target <= self.nice:
            return
        pid = self._proc.pid if self._proc else 0
        if not self._set_priority(target):
            log.warning("Parquet sinks: process %d caught up, but not all its threads may be "
                        "niced (+%d): it counts as at the driver's priority, and no stall "
                        "bound runs", pid, target)
            return
        log.info("Parquet sinks: process %d caught up with the topic %.0f s after its start; "
                 "now at nice +%d, yielding the cores to the online path", pid,
                 self._yielded_at - self._started_at, target)
        self.nice = target

    def _escalate_if_stalled(self) -> None:
        bound = self.settings.stream_realtime_offline_stall_seconds
        if not bound or self.nice <= self._driver_nice():
            return
        assert self._yielded_at is not None
        stalled = stalled_for(time.time(), self._yielded_at, self._caught_up_at)
        if stalled <= bound:
            return
        pid = self._proc.pid if self._proc else 0
        self.escalation_why = f"not caught up for {stalled:.0f} s at nice +{self.nice}"
        self.escalations += 1
        if self._set_priority(self._driver_nice()):
            log.warning("Parquet sinks: process %d at nice +%d has not caught up with the topic "
                        "for %.0f s (SHOPSTREAM_STREAM_REALTIME_OFFLINE_STALL_SECONDS): the "
                        "cores are full. Its threads now run at the driver's priority (nice "
                        "+%d) for the rest of this run; the offline store keeps up, and the "
                        "online path's freshness pays for it", pid, self.nice, stalled,
                        self._driver_nice())
            self.nice = self._driver_nice()
            return
        log.warning("Parquet sinks: process %d at nice +%d has not caught up with the topic "
                    "for %.0f s (SHOPSTREAM_STREAM_REALTIME_OFFLINE_STALL_SECONDS): the cores "
                    "are full, and this process may not lower a nice value. Restarting it at "
                    "the driver's priority for the rest of this run; the offline store keeps "
                    "up, and the online path's freshness pays for it", pid, self.nice, stalled)
        self.stop(0.0)
        code = self.returncode
        if code not in _STOPPED_EXITS:
            self.check()  # it failed on its own meanwhile: say so
        self.start()

    @staticmethod
    def _driver_nice() -> int:
        return os.getpriority(os.PRIO_PROCESS, 0)

    def _set_priority(self, target: int) -> bool:
        """Set every thread of the child and of its descendants (its JVM, its Python workers)
        to nice ``target``, in place: threads they start later inherit it. Raising a nice
        value is always allowed for one's own threads; lowering one takes the
        ``CAP_SYS_NICE`` capability (or a ``RLIMIT_NICE`` that allows it). True when every
        thread was set; False when some were refused (logged when others were set, so the
        log never says "the driver's priority" of a process half niced), or where there is
        no ``/proc``."""
        if self._proc is None or not Path("/proc/self/task").is_dir():
            return False
        done: set[int] = set()
        refused: set[int] = set()
        for _ in range(2):  # a thread started during the first pass is caught by the second
            for pid in (self._proc.pid, *descendants(self._proc.pid)):
                try:
                    tids = os.listdir(f"/proc/{pid}/task")
                except FileNotFoundError:
                    continue
                for tid in map(int, tids):
                    try:
                        os.setpriority(os.PRIO_PROCESS, tid, target)
                        done.add(tid)
                    except ProcessLookupError:
                        continue
                    except PermissionError:
                        refused.add(tid)
        done -= refused
        if refused and done:
            log.warning("Parquet sinks: %d of the %d threads of process %d and its children "
                        "are now at nice %+d; the other %d may not be (not this user's, or no "
                        "CAP_SYS_NICE)", len(done), len(done) + len(refused), self._proc.pid,
                        target, len(refused))
        return not refused

    def stop(self, grace_seconds: float) -> None:
        """SIGTERM (it finishes its running micro-batch), then SIGKILL after ``grace_seconds``
        (plus 30 s)."""
        try:
            self._stop(grace_seconds)
        finally:
            for path in (self.pulse_path, staged_pulse(self.pulse_path)):
                with contextlib.suppress(OSError):
                    path.unlink()

    def _stop(self, grace_seconds: float) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        self._stopping = True
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_seconds + 30)
        except subprocess.TimeoutExpired:
            log.warning("Parquet sinks: process %d still running after %.0f s; killing it "
                        "(its batch is replayed on the next start)", proc.pid, grace_seconds + 30)
            proc.kill()
            proc.wait()
