"""The freshness runs' CPU accounting: a Real-time driver's CPU by part, from ``/proc``."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from benchmarks.streaming_throughput import cpu_note, drain_cpu_note, realtime_cpu_s, stream_cpu_s

SPIN_S = 0.4
# a child that burns SPIN_S of CPU, then waits (a part is counted while it is alive)
SPIN = f"import time\nt=time.process_time()\nwhile time.process_time()-t<{SPIN_S}: pass\ntime.sleep(60)"


@pytest.fixture()
def driver():
    """A stand-in for the Real-time driver: a process whose children run what the real
    driver's do (by command line: a JVM, a feed process, the Parquet sinks' process)."""
    script = (
        "import subprocess, sys, time\n"
        f"spin = {SPIN!r}\n"
        "kids = [subprocess.Popen(['bash', '-c', 'exec -a /usr/lib/jvm/bin/java \"$0\" -c \"$1\"',"
        " sys.executable, spin]),\n"
        "        subprocess.Popen([sys.executable, '-c', spin, '-m', 'pipelines.streaming.feed_process']),\n"
        "        subprocess.Popen([sys.executable, '-c', spin, 'stream', '--offline-only'])]\n"
        "print('started', flush=True)\n"
        "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
    yield proc
    import os
    import signal

    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_each_child_of_the_driver_counts_for_its_part(driver: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    used = realtime_cpu_s(driver.pid)
    while min(used["query_jvm"], used["feeds"], used["sinks"]) < SPIN_S * 0.9:
        assert time.monotonic() < deadline, used
        time.sleep(0.1)
        used = realtime_cpu_s(driver.pid)
    for part in ("query_jvm", "feeds", "sinks"):
        # each spun SPIN_S (a clock tick more at most) and was not counted twice
        assert SPIN_S * 0.9 <= used[part] < SPIN_S * 2, used
    assert used["driver"] < SPIN_S, used  # the driver itself only started them


def test_the_note_names_each_part_and_the_sum() -> None:
    note = cpu_note("realtime", {"query_jvm": 0.72, "feeds": 0.31, "kafka": 0.15, "seconds": 300.0})
    assert note.startswith("realtime: CPU over the run's 300 s")
    assert "the Real-time query's JVM 0.72" in note and "the Kafka broker 0.15" in note
    assert note.endswith("together 1.18")


@pytest.fixture()
def stream_driver():
    """A stand-in for the benchmark's process while it drains the in-process stream: its
    children are a JVM whose child is the Python workers' daemon (which has reaped one
    worker that ran and exited), a broker JVM it started (a server: not the stream's) and
    a helper process of its own. Each spins SPIN_S."""
    daemon = (
        "import os, sys, time\n"
        f"spin = {SPIN!r}\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    exec(spin.replace('time.sleep(60)', ''))\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "exec(spin)\n")
    # renamed to java, this interpreter finds no compiled modules (subprocess): os alone
    jvm = (
        "import os\n"
        "if os.fork() == 0:\n"
        f"    os.execv({sys.executable!r}, [{sys.executable!r}, '-c', {daemon!r}, '-m', 'pyspark.daemon'])\n"
        f"exec({SPIN!r})\n")
    script = (
        "import subprocess, sys, time\n"
        "java = lambda code: subprocess.Popen(['bash', '-c', 'exec -a /usr/lib/jvm/bin/java \"$0\" -c \"$1\"',"
        " sys.executable, code])\n"
        f"jvm = java({jvm!r})\n"
        f"broker = java({SPIN!r})\n"
        f"helper = subprocess.Popen([sys.executable, '-c', {SPIN!r}])\n"
        "print(broker.pid, flush=True)\n"
        "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout is not None
    broker = int(proc.stdout.readline())
    yield proc, broker
    import os
    import signal

    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_a_drain_counts_the_jvm_and_its_workers_apart_and_not_the_servers(stream_driver) -> None:
    proc, broker = stream_driver
    deadline = time.monotonic() + 30
    used = stream_cpu_s(proc.pid, exclude={broker})
    while used["jvm"] < SPIN_S * 0.9 or used["workers"] < 2 * SPIN_S * 0.9:
        assert time.monotonic() < deadline, used
        time.sleep(0.1)
        used = stream_cpu_s(proc.pid, exclude={broker})
    assert SPIN_S * 0.9 <= used["jvm"] < SPIN_S * 2, used  # not the broker's, nor the workers'
    # the daemon's own spin and the worker it reaped
    assert 2 * SPIN_S * 0.9 <= used["workers"] < SPIN_S * 3, used
    assert used["driver"] < SPIN_S, used  # the helper's spin is not the driver's


def test_the_drain_note_gives_each_part_per_million_events() -> None:
    note = drain_cpu_note("drain", {"jvm": 26.0, "workers": 15.0, "driver": 1.0, "redis": 3.0,
                                    "kafka": 4.0}, 2_000_000)
    assert note == ("drain: CPU seconds per million events: its JVM 13.0; its Python workers 7.5; "
                    "its driver's Python (foreachBatch) 0.5; redis-server 1.5; "
                    "the Kafka broker 2.0; together 24.5")


def test_children_under_the_threads_after_one_that_ended_are_found(tmp_path) -> None:
    """A JVM's threads come and go while their children are read: a thread whose
    ``children`` file is gone (it ended) is skipped, and the children listed under the
    threads read after it are still found (the reading once stopped there, and a drain's
    Python workers counted as 0.0 s). A process that is gone has none."""
    from benchmarks.common import child_pids

    tasks = tmp_path / "100" / "task"
    for tid, children in (("100", "201 "), ("101", None), ("102", "202 203 "), ("103", "")):
        (tasks / tid).mkdir(parents=True)
        if children is not None:
            (tasks / tid / "children").write_text(children)
    # the threads are read in order: the one that ended comes before 202 and 203
    assert sorted(child_pids(100, proc=tmp_path)) == [201, 202, 203]
    assert child_pids(999, proc=tmp_path) == []
    # and the real /proc: this process's child
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        import os

        assert proc.pid in child_pids(os.getpid())
    finally:
        proc.kill()
        proc.wait()
