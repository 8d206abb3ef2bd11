"""`python -m smelt_interp.app.keeper CMD [ARG ...]`: runs the dashboard's background trainer
CMD and ends it, with everything it started, when the dashboard goes away, however it goes.

The dashboard (app.jobs) starts the keeper in a session of its own, so the keeper, CMD and
whatever CMD starts (a wrapper script's real worker) share one process group, and the
dashboard stops them all with one signal to the group. The keeper ignores those signals itself
(CMD answers them; the keeper waits and exits with CMD's status).

The dashboard holds the only write end of a pipe on the keeper's stdin and never writes to it.
When the dashboard process ends, by a clean exit, a crash or SIGKILL, the kernel closes that
end and the keeper reads end-of-file: it then stops the group the way the dashboard would
(SIGINT, then SIGTERM, then SIGKILL). Why a pipe rather than PR_SET_PDEATHSIG: the death signal
reaches only the direct child (a wrapper's worker never gets it), it is sent when the thread
that started the child ends rather than the process, and it is Linux only; a pipe's
end-of-file arrives whenever its last writer is gone, on every POSIX system."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence

GRACE_S = 20.0  # after SIGINT, how long the trainer may take to stop (as app.jobs.stop)


def _ignore(signum: int, frame: object) -> None:
    """A Python handler, not SIG_IGN: the trainer starts with default handlers (an ignored
    signal would be inherited across exec and the trainer could not be stopped)."""


def stop_group(proc: subprocess.Popen, grace: float = GRACE_S) -> None:
    """SIGINT to this process group, then SIGTERM, then SIGKILL (which ends the keeper too),
    each after `proc` failed to exit within its wait."""
    group = os.getpgrp()
    for sig, wait in ((signal.SIGINT, grace), (signal.SIGTERM, 5.0)):
        os.killpg(group, sig)
        try:
            proc.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue
    os.killpg(group, signal.SIGKILL)  # anything a wrapper left behind, and the keeper


def _watch_parent(proc: subprocess.Popen) -> None:
    """Wait for end-of-file on stdin (the dashboard gone), then stop the group."""
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    stop_group(proc)


def main(argv: Sequence[str]) -> int:
    if not argv:
        print("error: usage: python -m smelt_interp.app.keeper CMD [ARG ...]", file=sys.stderr)
        return 2
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _ignore)
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL)
    except OSError as exc:
        print(f"error: cannot start {argv[0]}: {exc.strerror or exc}", file=sys.stderr)
        return 127
    threading.Thread(target=_watch_parent, args=(proc,), daemon=True).start()
    code = proc.wait()
    if code < 0:  # ended by a signal: end the same way, so the dashboard sees what CMD saw
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
