"""One streaming job per checkpoint on a machine (``pipelines.checkpoint_lock``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pipelines.checkpoint_lock import CheckpointBusy, checkpoint_lock, lock_path

REPO = Path(__file__).resolve().parents[2]


def test_a_second_job_on_the_same_checkpoint_is_told_who_holds_it(tmp_path: Path) -> None:
    with checkpoint_lock(tmp_path, "s3a://bucket/checkpoints/q", wait_seconds=0):
        with pytest.raises(CheckpointBusy) as raised:
            with checkpoint_lock(tmp_path, "s3a://bucket/checkpoints/q/", wait_seconds=0.3):
                pass
        assert f"(pid {os.getpid()})" in str(raised.value)
        assert "s3a://bucket/checkpoints/q" in str(raised.value)
        with checkpoint_lock(tmp_path, "s3a://bucket/checkpoints/other", wait_seconds=0):
            pass  # another checkpoint is another lock
    with checkpoint_lock(tmp_path, "s3a://bucket/checkpoints/q", wait_seconds=0):
        pass  # released with the block


def test_a_predecessor_finishing_its_batch_is_waited_for(tmp_path: Path) -> None:
    held, release = threading.Event(), threading.Event()

    def predecessor() -> None:
        with checkpoint_lock(tmp_path, "/data/checkpoints/q", wait_seconds=0):
            held.set()
            release.wait(10)

    thread = threading.Thread(target=predecessor)
    thread.start()
    assert held.wait(10)
    threading.Timer(0.5, release.set).start()
    started = time.monotonic()
    with checkpoint_lock(tmp_path, "/data/checkpoints/q", wait_seconds=10):
        waited = time.monotonic() - started
    thread.join()
    assert 0.3 < waited < 10


def test_the_lock_dies_with_its_holder_whatever_kills_it(tmp_path: Path) -> None:
    """kill -9 leaves the lock file behind but not the lock: the kernel releases it."""
    code = ("import sys, time; from pathlib import Path; "
            "from pipelines.checkpoint_lock import checkpoint_lock\n"
            f"with checkpoint_lock(Path({str(tmp_path)!r}), '/data/cp', wait_seconds=0):\n"
            "    print('held', flush=True); time.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(CheckpointBusy, match=f"pid {holder.pid}"):
            with checkpoint_lock(tmp_path, "/data/cp", wait_seconds=0.2):
                pass
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        assert lock_path(tmp_path, "/data/cp").exists()
        with checkpoint_lock(tmp_path, "/data/cp", wait_seconds=5):
            pass
    finally:
        if holder.poll() is None:
            holder.kill()
