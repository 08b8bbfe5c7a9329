"""One streaming job per checkpoint on a machine.

Spark does not stop two processes from running a query on the same checkpoint. The
second one replays the batch the first is still writing, and the two then race on the
same output files until one of them fails on the offset log. That happens without any
mistake of the user's: when the Real-time driver is killed, its Parquet sinks' process
gets SIGTERM from the kernel and finishes its running micro-batch (as any
``shopstream stream`` does), and a supervisor that restarts the driver at once starts a
new sinks' process on the same checkpoint meanwhile. So each job takes an exclusive
``flock`` on a lock file named after its checkpoint, under the (always local) run
directory, and waits for a predecessor to finish its batch. The kernel releases the
lock when the holder dies, however it dies.

It guards one machine. On a cluster, where a restarted driver may run elsewhere, the
supervisor (Kubernetes, YARN) must keep to one driver per query.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["CheckpointBusy", "checkpoint_lock", "lock_path"]

log = logging.getLogger(__name__)


class CheckpointBusy(RuntimeError):
    """Another process held the checkpoint's lock for longer than the wait."""


def lock_path(run_dir: Path, checkpoint: str) -> Path:
    """The lock file of ``checkpoint`` (a path or a URI) under ``run_dir``."""
    digest = hashlib.sha256(checkpoint.rstrip("/").encode()).hexdigest()[:16]
    return run_dir / "locks" / f"checkpoint-{digest}.lock"


def _holder(fd: int) -> str:
    with contextlib.suppress(OSError, ValueError):
        text = os.pread(fd, 64, 0).decode().strip()
        if text:
            return text
    return "unknown"


@contextlib.contextmanager
def checkpoint_lock(run_dir: Path, checkpoint: str, wait_seconds: float) -> Iterator[None]:
    """Hold ``checkpoint``'s lock for the block, waiting up to ``wait_seconds`` for a process
    that holds it (e.g. a predecessor finishing its batch); then :class:`CheckpointBusy`,
    naming the holder's pid."""
    path = lock_path(run_dir, checkpoint)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait_seconds
        said = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise CheckpointBusy(
                        f"checkpoint {checkpoint} is in use by another shopstream stream on this "
                        f"machine (pid {_holder(fd)}); stop it first, or give this job a "
                        "checkpoint of its own (SHOPSTREAM_CHECKPOINT_DIR)") from None
                if not said:
                    log.info("checkpoint %s is held by pid %s (a predecessor finishing its "
                             "batch?); waiting up to %.0f s", checkpoint, _holder(fd), wait_seconds)
                    said = True
                time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock
