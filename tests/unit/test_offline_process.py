"""Real-time Mode's Parquet sinks process (pipelines.streaming.offline_process): its lifecycle rules."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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
