"""Real-time Mode's Parquet sinks process (pipelines.streaming.offline_process): its lifecycle rules."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipelines.settings import Settings
from pipelines.streaming.offline_process import (
    PARENT_PID_ENV,
    OfflineSinksFailed,
    OfflineSinksProcess,
)

REPO = Path(__file__).resolve().parents[2]

_CHILD = (
    "from pipelines.streaming.offline_process import die_with_parent\n"
    "die_with_parent()\n"
    "import time; print('ready', flush=True); time.sleep(120)\n"
)
_PARENT = (
    "import os, subprocess, sys, time\n"
    f"env = dict(os.environ, {PARENT_PID_ENV}=str(os.getpid()))\n"
    "child = subprocess.Popen([sys.executable, '-c', sys.argv[1]], env=env, stdout=subprocess.PIPE)\n"
    "assert child.stdout.readline().strip() == b'ready'\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(120)\n"
)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_kill_9_of_the_driver_stops_its_sinks_process() -> None:
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, _CHILD], cwd=REPO,
                              stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert _alive(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the sinks process outlived its killed driver"
    finally:
        if parent.poll() is None:
            parent.kill()


_GRACEFUL_CHILD = (
    "from pipelines.streaming.offline_process import die_with_parent\n"
    "from pipelines.signals import GracefulStop\n"
    "import os, time\n"
    "die_with_parent()\n"
    "with GracefulStop('sinks') as stop:\n"
    "    print('ready', flush=True)\n"
    "    assert stop.requested.wait(60)\n"
    "    time.sleep(1.0)  # its running batch: a repeat of the signal must not cut it short\n"
    "    with open(os.environ['RESULT_FILE'], 'w') as out:  # its driver's pipe is gone\n"
    "        out.write(f'finished: {stop.signal_name}')\n"
)
_THREADED_PARENT = (
    "import os, subprocess, sys, threading, time\n"
    "for _ in range(8):  # a driver has many threads; each one's exit re-parents the child\n"
    "    threading.Thread(target=time.sleep, args=(120,), daemon=True).start()\n"
    + _PARENT.split("\n", 1)[1]
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_the_sinks_process_finishes_its_batch_when_its_threaded_driver_is_killed(
        tmp_path: Path) -> None:
    """The kernel sends the parent-death signal again each time the child passes to another
    of the dying driver's threads; taken as SIGTERM, the repeat stopped the sinks at once."""
    result = tmp_path / "result"
    parent = subprocess.Popen([sys.executable, "-c", _THREADED_PARENT, _GRACEFUL_CHILD],
                              cwd=REPO, stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, RESULT_FILE=str(result)))
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 20
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
        assert result.exists() and result.read_text() == "finished: parent died"
    finally:
        if parent.poll() is None:
            parent.kill()


def test_a_child_whose_parent_is_already_gone_exits_at_once() -> None:
    env = dict(os.environ, **{PARENT_PID_ENV: "1"})  # not our parent: it died and we were adopted
    done = subprocess.run([sys.executable, "-c", _CHILD], cwd=REPO, env=env, capture_output=True,
                          timeout=60)
    assert done.returncode != 0
    assert b"is gone" in done.stderr


def test_check_tells_a_clean_end_from_a_failure() -> None:
    sinks = OfflineSinksProcess(Settings(_env_file=None), stop="idle", idle_seconds=1.0)
    assert sinks.check() is False  # not started: nothing to report
    sinks._proc = subprocess.Popen([sys.executable, "-c", "pass"])
    sinks._proc.wait()
    assert sinks.check() is True
    sinks._proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    sinks._proc.wait()
    with pytest.raises(OfflineSinksFailed, match="exited with 3"):
        sinks.check()


def test_a_niced_sinks_process_stalls_from_when_it_was_niced_until_it_catches_up() -> None:
    from pipelines.streaming.offline_process import stalled_for

    assert stalled_for(now=110.0, started=100.0, last_pulse=None) == 10.0
    # a pulse from before it was niced (the one that got it niced) does not count
    assert stalled_for(now=110.0, started=100.0, last_pulse=95.0) == 10.0
    assert stalled_for(now=110.0, started=100.0, last_pulse=107.5) == 2.5
    assert stalled_for(now=100.0, started=100.0, last_pulse=100.5) == 0.0  # clocks' jitter


def test_a_sinks_batch_caught_up_when_it_read_all_there_was_within_its_trigger() -> None:
    from pipelines.streaming.offline_process import caught_up_within

    def batch(latest: int, took_ms: int) -> dict[str, Any]:
        return {"durationMs": {"triggerExecution": took_ms},
                "sources": [{"endOffset": '{"t":{"0":500}}', "latestOffset": f'{{"t":{{"0":{latest}}}}}'}]}

    assert caught_up_within(None, 30.0) is True  # an idle report
    assert caught_up_within(batch(500, 9_000), 30.0) is True
    assert caught_up_within(batch(900, 9_000), 30.0) is False  # maxOffsetsPerTrigger left some
    # all there was when planned, but 51 s of a 30 s trigger: 50,000 events came meanwhile
    assert caught_up_within(batch(500, 51_000), 30.0) is False
    assert caught_up_within({"sources": [{"endOffset": "{}"}]}, 30.0) is True  # cannot tell


# A stand-in for `shopstream stream --offline-only`: it applies the nice value it is given as
# the real one does (0 from its driver), runs a second thread as a JVM would, pulses (caught
# up each time, once, or never), and stops on SIGTERM as the CLI does before its query's
# handlers are in place (a Ctrl-C: exit 130).
_STAND_IN = (
    "import os, signal, sys, threading, time\n"
    "from pipelines.settings import Settings\n"
    "from pipelines.streaming.offline_process import lower_priority, pulse_from_env\n"
    "signal.signal(signal.SIGTERM, signal.default_int_handler)\n"
    "lower_priority(Settings(_env_file=None))\n"
    "threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
    "pulse = pulse_from_env(30.0)\n"
    "behind = {'sources': [{'endOffset': {'t': {'0': 500}}, 'latestOffset': {'t': {'0': 900}}}]}\n"
    "caught_up = sys.argv[1] in ('pulse', 'once')\n"
    "try:\n"
    "    while True:\n"
    "        if sys.argv[1] != 'silent':\n"
    "            pulse(None if caught_up else behind)  # an idle report, or a capped batch\n"
    "        caught_up = sys.argv[1] == 'pulse'\n"
    "        time.sleep(0.1)\n"
    "except KeyboardInterrupt:\n"
    "    sys.exit(130)\n"
)
NICED = Settings(_env_file=None).stream_realtime_offline_nice


class _StandIn(OfflineSinksProcess):
    def __init__(self, settings: Settings, behaviour: str) -> None:
        super().__init__(settings, stop="never", idle_seconds=0.0)
        self.behaviour = behaviour
        self.pids: list[int] = []

    def _command(self) -> list[str]:
        return [sys.executable, "-c", _STAND_IN, self.behaviour]

    def start(self) -> None:
        super().start()
        assert self._proc is not None
        self.pids.append(self._proc.pid)


def _threads_nice(pid: int) -> set[int]:
    return {os.getpriority(os.PRIO_PROCESS, int(tid)) for tid in os.listdir(f"/proc/{pid}/task")}


def _run_checks(sinks: OfflineSinksProcess, seconds: float,
                until: Callable[[], bool] | None = None) -> None:
    """The driver's wait loop: :meth:`check` every 0.1 s for ``seconds``, or until ``until``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not (until and until()):
        assert sinks.check() is False
        time.sleep(0.1)


class _Unprivileged(_StandIn):
    """A driver that may not lower a nice value (no ``CAP_SYS_NICE``): it restarts the process."""

    def _set_priority(self, target: int) -> bool:
        return False if target < self.nice else super()._set_priority(target)


def _settings(tmp_path: Path) -> Settings:
    return Settings(_env_file=None, data_dir=str(tmp_path), stream_realtime_offline_stall_seconds=2.0)


def test_a_sinks_process_starts_at_the_drivers_priority_and_is_niced_once_caught_up(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pipelines.streaming.offline_process")
    settings = _settings(tmp_path)
    sinks = _StandIn(settings, "pulse")
    # a driver killed with SIGKILL left its pulse behind; a live one's stays
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    settings.run_path.mkdir(parents=True, exist_ok=True)
    left = settings.run_path / f"offline-sinks.{gone.pid}.pulse"
    live = settings.run_path / f"offline-sinks.{os.getppid()}.pulse"
    left.touch()
    live.touch()
    sinks.start()
    assert not left.exists() and live.exists()
    driver = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        assert _threads_nice(sinks.pids[0]) == {driver}  # its start takes what it needs
        _run_checks(sinks, 30.0, until=lambda: sinks.nice != driver)
        pid = sinks.pids[0]
        assert sinks.nice == NICED == 19 and _threads_nice(pid) == {NICED}, "every thread niced"
        assert "caught up with the topic" in caplog.text and "now at nice +19" in caplog.text
        _run_checks(sinks, 4.0)  # it keeps catching up: it keeps its lower priority
        assert sinks.pids == [pid] and sinks.escalations == 0 and _threads_nice(pid) == {NICED}
        assert sinks.pulse_path.exists()
    finally:
        sinks.stop(0.0)
    assert sinks.check() is True
    assert not sinks.pulse_path.exists()


def test_a_sinks_process_that_has_not_caught_up_keeps_the_drivers_priority(
        tmp_path: Path) -> None:
    """Its JVM's start and its backlog take what they need (a JVM started at nice +19 on a
    full machine had not started its query after 300 s): no stall bound runs before."""
    sinks = _StandIn(_settings(tmp_path), "silent")
    sinks.start()
    try:
        _run_checks(sinks, 4.0)  # twice the stall bound
        assert sinks.pids == sinks.pids[:1] and sinks.escalations == 0
        assert _threads_nice(sinks.pids[0]) == {os.getpriority(os.PRIO_PROCESS, 0)}
    finally:
        sinks.stop(0.0)
    assert sinks.check() is True  # the stop's exit 130 is not a failure


def test_a_sinks_process_partly_refused_its_nice_counts_as_at_the_drivers_priority(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread that is not this user's refuses a higher nice value (the OS says
    ``EPERM``): the log says how many threads were niced, and the process is not taken
    for niced, so no stall bound runs against it."""
    caplog.set_level(logging.INFO, logger="pipelines.streaming.offline_process")
    sinks = _StandIn(_settings(tmp_path), "pulse")
    setpriority = os.setpriority

    def refuse_the_main_thread(which: int, who: int, prio: int) -> None:
        if sinks.pids and who == sinks.pids[0]:
            raise PermissionError(1, "Operation not permitted")
        setpriority(which, who, prio)

    monkeypatch.setattr(os, "setpriority", refuse_the_main_thread)
    driver = os.getpriority(os.PRIO_PROCESS, 0)
    sinks.start()
    try:
        pid = sinks.pids[0]
        _run_checks(sinks, 30.0, until=lambda: "counts as at the driver's priority" in caplog.text)
        threads = {int(tid): os.getpriority(os.PRIO_PROCESS, int(tid))
                   for tid in os.listdir(f"/proc/{pid}/task")}
        assert threads.pop(pid) == driver and set(threads.values()) == {NICED}
        assert f"{len(threads)} of the {len(threads) + 1} threads of process {pid}" in caplog.text
        assert "the other 1 may not be" in caplog.text
        assert "now at nice +19, yielding" not in caplog.text and sinks.nice == driver
        _run_checks(sinks, 4.0)  # twice the stall bound: none runs
        assert sinks.escalations == 0 and sinks.pids == [pid]
    finally:
        sinks.stop(0.0)


def _stalling(kind: type[_StandIn], tmp_path: Path) -> _StandIn:
    """A stand-in that catches up once and never again, started with a 2 s stall bound:
    niced, then checked for 4 s, long enough for its driver to give it its own priority."""
    sinks = kind(_settings(tmp_path), "once")
    sinks.start()
    _run_checks(sinks, 30.0, until=lambda: sinks.nice == NICED)
    assert _threads_nice(sinks.pids[0]) == {NICED}
    _run_checks(sinks, 4.0)  # it pulses, but not caught up, for twice the bound
    assert sinks.escalations == 1 and sinks.escalation_why.startswith("not caught up for ")
    return sinks


def test_a_stalled_sinks_process_gets_the_drivers_priority_in_place_where_permitted(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sinks = _stalling(_StandIn, tmp_path)
    try:
        pid = sinks.pids[0]
        if os.geteuid() != 0:  # not permitted: restarted instead (the next test's case)
            assert len(sinks.pids) == 2 and _threads_nice(sinks.pids[1]) == {0}
            return
        assert sinks.pids == [pid] and _alive(pid), "reniced in place, not restarted"
        assert _threads_nice(pid) == {0} and sinks.nice == 0
        assert "Its threads now run at the driver's priority (nice +0)" in caplog.text
        _run_checks(sinks, 3.0)  # at the driver's priority: nothing more to give it
        assert sinks.escalations == 1 and _threads_nice(pid) == {0}
    finally:
        sinks.stop(0.0)
    assert sinks.check() is True  # the stop's exit 130 is not a failure


def test_a_stalled_sinks_process_is_restarted_once_at_the_drivers_priority(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sinks = _stalling(_Unprivileged, tmp_path)  # stopped: its exit 130 is no failure
    try:
        first = sinks.pids[0]
        assert len(sinks.pids) == 2 and not _alive(first)
        assert sinks.nice == 0 and _threads_nice(sinks.pids[1]) == {0}
        assert "has not caught up" in caplog.text and "Restarting it at the driver's priority" in caplog.text
        # it catches up again at once: for the rest of the run it is not niced again
        _run_checks(sinks, 3.0)
        assert len(sinks.pids) == 2 and _threads_nice(sinks.pids[1]) == {0}
    finally:
        sinks.stop(0.0)
    assert sinks.check() is True  # the stop's exit 130 is not a failure either
    assert not sinks.pulse_path.exists()


def test_descendants_finds_a_grandchild() -> None:
    """The sinks' process runs its JVM as a child: renicing it must reach that far."""
    from pipelines.streaming.offline_process import descendants

    parent = subprocess.Popen([sys.executable, "-c", _PARENT, _CHILD], cwd=REPO,
                              stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert descendants(parent.pid) == [child]
        assert child in descendants(os.getpid())
    finally:
        parent.kill()
        parent.wait()


def test_a_sinks_process_failing_on_its_own_is_still_a_failure(tmp_path: Path) -> None:
    """Only a stop the driver asked for makes a Ctrl-C's exit 130 a clean end."""
    sinks = OfflineSinksProcess(Settings(_env_file=None, data_dir=str(tmp_path)), stop="never",
                                idle_seconds=0.0)
    sinks._proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(130)"])
    sinks._proc.wait()
    with pytest.raises(OfflineSinksFailed, match="exited with 130"):
        sinks.check()
