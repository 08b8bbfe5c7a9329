"""Background server processes tracked by pid files.

``infra up`` starts each server in its own session (so a Ctrl-C in the shell
that ran ``up`` does not kill it), records its pid, and ``infra down`` stops
exactly the pids it recorded: never a process the project did not start.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

__all__ = ["ManagedProcess", "wait_until", "StartupError", "pid_alive", "ensure_ports_free",
           "log_size", "free_port"]

T = TypeVar("T")

_PORTS_GIVEN: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, and one this process has not handed out before.

    For tests and benchmarks that start their own servers. The kernel may give the same
    free port to two binds in a row (nothing holds it in between): a broker given one port
    for its listener and its controller fails to start."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in _PORTS_GIVEN:
            _PORTS_GIVEN.add(port)
            return port


class StartupError(RuntimeError):
    """A server did not become ready in time; the message names its log file."""


def wait_until(
    probe: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    interval: float = 0.1,
    alive: Callable[[], bool] | None = None,
    log_file: Path | None = None,
    log_from: int = 0,
) -> T:
    """Call ``probe`` until it returns a truthy value (exceptions count as "not yet").

    Backs off from ``interval`` up to one second. Fails fast when ``alive``
    says the process behind it has exited.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    delay = interval
    while True:
        try:
            result = probe()
            if result:
                return result
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready yet"
            last_error = exc
        hint = f"; see {log_file}" if log_file else ""
        if alive is not None and not alive():
            reason = _reason_in_log(log_file, log_from) if log_file else None
            raise StartupError(f"{what} exited during startup"
                               + (f" ({reason})" if reason else "") + hint)
        if time.monotonic() > deadline:
            detail = f" (last error: {last_error})" if last_error else ""
            raise StartupError(f"{what} not ready after {timeout:.0f}s{detail}{hint}")
        time.sleep(delay)
        delay = min(delay * 1.5, 1.0)


_FAILURE = re.compile(r"already in use|error|exception|fail|could not|cannot|denied|invalid",
                      re.IGNORECASE)


def log_size(log_file: Path) -> int:
    """Where a log that a server appends to ends now: what it writes from its next start on
    comes after (``wait_until``'s ``log_from``), so an earlier run's complaint is not taken
    for this one's."""
    try:
        return log_file.stat().st_size
    except OSError:
        return 0


def _reason_in_log(log_file: Path, log_from: int = 0, chars: int = 64_000) -> str | None:
    """The server's own last line of complaint (``bind: Address already in use``) since
    ``log_from``, so the error says why without opening the log; ``None`` when it wrote none."""
    try:
        with open(log_file, "rb") as log:
            log.seek(max(log_from, log.seek(0, os.SEEK_END) - chars))
            lines = log.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    complaints = [line.strip() for line in lines if _FAILURE.search(line)]
    if not complaints:
        return None
    # a port taken says it best; otherwise the last complaint is the one that stopped it
    taken = [line for line in complaints if "already in use" in line.lower()]
    return (taken or complaints)[-1][:240]


def ensure_ports_free(what: str, addresses: Sequence[tuple[str, int]], setting: str, *,
                      whose: str = " (not a server this run dir started)") -> None:
    """Refuse to start a server whose port something else already listens on.

    Otherwise the new server exits at once (redis-server) or after binding fails, and
    meanwhile the readiness probe may talk to the other process: a Kafka broker's port
    held by a web server took 32 s of client timeouts to be reported."""
    for host, port in addresses:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                pass
        except OSError:
            continue
        raise StartupError(f"cannot start {what}: something else already listens on "
                           f"{host}:{port}{whose}; stop it, or set {setting} to a free port")


class ManagedProcess:
    """A server process identified by a pid file."""

    def __init__(self, name: str, pid_file: Path, log_file: Path) -> None:
        self.name = name
        self.pid_file = pid_file
        self.log_file = log_file

    @property
    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        return pid if pid_alive(pid) else None

    def is_running(self) -> bool:
        return self.pid is not None

    def start(self, cmd: Sequence[str], *, env: dict[str, str] | None = None, cwd: Path | None = None) -> int:
        self.pid_file.parent.mkdir(parents=True, exist_ok=True)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen(  # noqa: S603 - command built from settings, not user input
                list(cmd),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=cwd,
                start_new_session=True,
            )
        self.pid_file.write_text(str(proc.pid))
        return proc.pid

    def stop(self, timeout: float = 20.0, sig: int = signal.SIGTERM) -> bool:
        """Stop the recorded pid; escalate to SIGKILL after ``timeout``. True if it was running."""
        pid = self.pid
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        _signal(pid, sig)
        deadline = time.monotonic() + timeout
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if pid_alive(pid):
            _signal(pid, signal.SIGKILL)
            while pid_alive(pid):
                time.sleep(0.05)
        self.pid_file.unlink(missing_ok=True)
        return True

    def kill(self) -> None:
        """SIGKILL, as a crash would (reliability tests)."""
        self.stop(timeout=0, sig=signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs: it exists (ours or another user's) and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours is not alive; reap it if it is ours.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        return state != "Z"
    except (FileNotFoundError, IndexError):
        return True
