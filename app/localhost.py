"""Loopback helpers shared by the tests, the benchmark and the scripts: free ports and child processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["Subprocess", "cpu_seconds", "free_port", "in_ci", "interrupt_on_sigterm", "worker_argv", "worker_env"]


def in_ci() -> bool:
    """True under CI (``CI`` set to anything but empty, ``0`` or ``false``), where ``make system-tools`` can install
    the programs the tests drive: a check that cannot run for want of one then fails instead of skipping."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false")


def interrupt_on_sigterm() -> None:
    """Make SIGTERM raise ``KeyboardInterrupt`` in the main thread: a script that started a worker or a broker
    then stops them on ``kill`` as on Ctrl-C (its ``finally`` blocks run; by default SIGTERM skips them and
    leaves the children running)."""
    signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def cpu_seconds(pid: int, thread: int | None = None) -> float:
    """CPU time a process has used so far (user + system, every thread), or one of its threads (``thread``: its id;
    the process's own id is its main thread). NaN where the kernel does not say (no ``/proc``, or it has exited).

    Read from the kernel, not timed on a clock: it does not grow while the machine runs other work, so what a
    stretch of work costs can be compared between runs on a busy machine.
    """
    stat = Path(f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat")
    try:
        fields = stat.read_text().rpartition(")")[2].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14 and 15)


def free_port() -> int:
    """Ask the kernel for a free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def worker_argv(log_level: str = "info", *extra: str) -> list[str]:
    """The command line of a ``seam worker`` run by this Python (the checkout it runs in is its ``cwd``)."""
    return [sys.executable, "-m", "app", "worker", "-l", log_level, *extra]


def worker_env(settings: Mapping[str, str], *, drop: tuple[str, ...] = ("SEAM_",)) -> dict[str, str]:
    """This process's environment less its ``SEAM_*`` variables (a worker refuses unknown ones), plus ``settings``."""
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)} | dict(settings)


class Subprocess:
    """A child process writing to its own log file, stopped by PID: SIGTERM once, then SIGKILL."""

    def __init__(self, argv: list[str], env: Mapping[str, str], log_path: Path, *, cwd: Path | None = None,
                 append: bool = False) -> None:
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab" if append else "wb")  # noqa: SIM115 - closed in stop()
        self._terminated = False
        self.proc = subprocess.Popen(argv, env=dict(env), cwd=cwd, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 60, traceback_lines: int = 40) -> str:
        """The log's last ``lines``, after its first traceback when that lies above them.

        A process that failed often goes on logging (retries, its shutdown) until the cause has scrolled
        out of the tail; the first traceback is usually that cause.
        """
        text = self.log_path.read_text(errors="replace").splitlines()
        first = next((i for i, line in enumerate(text) if line.startswith("Traceback (most recent call last)")),
                     None)
        if first is None or first >= len(text) - lines:
            return "\n".join(text[-lines:])
        cause = text[max(first - 2, 0):first + traceback_lines]
        return "\n".join([f"[the log's first traceback, line {first + 1}:]", *cause,
                          f"[... the log's last {lines} lines:]", *text[-lines:]])

    def wait_exit(self, timeout_s: float) -> int:
        """Wait for the process to exit by itself; return its exit code."""
        return self.proc.wait(timeout_s)

    def terminate(self) -> None:
        """Ask the process to stop (once: a second SIGTERM makes a Faust worker exit hard)."""
        if self.proc.poll() is None and not self._terminated:
            self._terminated = True
            self.proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL, and reap it."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, wait up to ``timeout_s``, then SIGKILL; return the exit code (negative if killed)."""
        if self.proc.poll() is None:
            self.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode
