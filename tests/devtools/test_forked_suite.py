"""The suite runs in processes forked from one that already ran it (the mutation run forks one
per mutant): thread-sensitive sync code must still run there."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

from asgiref.sync import sync_to_async


def _thread_sensitive_name() -> str:
    return asyncio.run(
        sync_to_async(lambda: threading.current_thread().name, thread_sensitive=True)()
    )


def test_thread_sensitive_code_runs_in_a_child_forked_after_it_ran_here():
    parent = _thread_sensitive_name()
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only when the work ran, 2 when it hung for 10 s
        signal.signal(signal.SIGALRM, lambda *_: os._exit(2))
        signal.alarm(10)
        try:
            os._exit(0 if _thread_sensitive_name() else 1)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert parent
    assert os.waitstatus_to_exitcode(status) == 0
