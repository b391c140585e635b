"""The worker runs each agent on its thread's long-lived event loop (runs.lease.run_async)."""

from __future__ import annotations

import asyncio
import os
import select
import signal
import threading

import pytest

from approvals.runs import lease

# Under the mutation run these go first for run_async's mutants: a loop reused in a forked
# child hangs whichever test reaches it first, and only the fork test below gives up soon.
pytestmark = pytest.mark.guards("approvals.runs.lease.run_async")


def test_the_loop_and_its_tool_threads_outlive_one_run():
    async def where() -> tuple[int, str]:
        loop = asyncio.get_running_loop()
        name = await asyncio.to_thread(lambda: threading.current_thread().name)
        return id(loop), name

    first, second = lease.run_async(where()), lease.run_async(where())

    assert first[0] == second[0]
    assert first[1].startswith("agent-tools") and second[1].startswith("agent-tools")


def test_what_a_run_left_running_is_cancelled_before_it_returns():
    left: list[asyncio.Task] = []

    async def leaves_a_task() -> str:
        left.append(asyncio.create_task(asyncio.sleep(3600)))
        return "done"

    assert lease.run_async(leaves_a_task()) == "done"
    assert left[0].cancelled()
    # No loop stays set on the thread between runs.
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()


def test_a_left_task_that_cleans_up_over_several_steps_is_waited_for_to_its_end():
    cleaned: list[str] = []

    async def holds_a_resource() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            # Its clean-up takes a few turns of the loop, as closing a connection does.
            for _ in range(3):
                await asyncio.sleep(0)
            cleaned.append("closed")

    async def leaves_it_running() -> str:
        asyncio.create_task(holds_a_resource())
        await asyncio.sleep(0)
        return "done"

    assert lease.run_async(leaves_it_running()) == "done"
    assert cleaned == ["closed"]


def test_an_error_of_the_run_reaches_the_caller_and_the_loop_stays_usable():
    async def fails():
        raise ValueError("the agent broke")

    with pytest.raises(ValueError, match="the agent broke"):
        lease.run_async(fails())

    async def works() -> int:
        return 42

    assert lease.run_async(works()) == 42


def test_each_thread_has_its_own_loop():
    async def loop_id() -> int:
        return id(asyncio.get_running_loop())

    here = lease.run_async(loop_id())
    there: list[int] = []
    thread = threading.Thread(target=lambda: there.append(lease.run_async(loop_id())))
    thread.start()
    thread.join()

    assert there and there[0] != here


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX's")
def test_a_forked_process_runs_its_tools_on_threads_of_its_own():
    """A process forked after the loop was made (a preforking server, the mutation run) has
    none of its parent's tool threads: it gets its own loop and pool, instead of waiting for
    ever on work handed to threads that do not exist."""

    async def tool_thread() -> str:
        return await asyncio.to_thread(lambda: threading.current_thread().name)

    parent = lease.run_async(tool_thread())
    parent_loop = lease._loops.loop
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child answers through the pipe, then leaves at once
        try:
            os.write(write, lease.run_async(tool_thread()).encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        # Without a loop of its own the child would wait for ever: give up on it after 10 s
        # (it answers in milliseconds).
        ready, _, _ = select.select([read], [], [], 10)
        answered = os.read(read, 100).decode() if ready else "(no answer: the child hangs)"
    finally:
        os.close(read)
        if not ready:
            os.kill(child, signal.SIGKILL)
        _, status = os.waitpid(child, 0)

    assert parent.startswith("agent-tools")
    assert answered.startswith("agent-tools"), answered
    assert os.waitstatus_to_exitcode(status) == 0
    assert lease._loops.loop is parent_loop
