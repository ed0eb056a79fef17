"""What the server's own helper processes (the JSON worker, the grammar probe) share."""

from __future__ import annotations

import os
import signal
import sys


def die_with_parent(parent: int) -> None:
    """In a helper process: end with the server, however it ends. A helper holds copies of the server's
    stdout/stderr and of its own pipes, so it would outlive a server killed by SIGKILL (or an MPI abort),
    and an MPI launcher waiting for the rank's output to close would wait for ever (PR_SET_PDEATHSIG,
    prctl(2); Linux only, elsewhere the helper ends when its pipe closes)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    if os.getppid() != parent:  # the server died before the line above took effect
        os._exit(0)
