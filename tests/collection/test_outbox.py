"""`Outbox` (pure asyncio): groups by size, by age and on close; a full outbox makes
`put` wait; a cancelled `put` still keeps its item.

`await started()` is one loop step, not a clock: a task created just before runs its first
step in it, up to its first wait (nothing here does I/O, so nothing else can delay it)."""

from __future__ import annotations

import asyncio

import pytest

from collection.outbox import Outbox


async def started() -> None:
    """Let the tasks created before this call run up to their first wait."""
    await asyncio.sleep(0)


def test_full_groups_go_out_at_once_and_the_rest_on_close() -> None:
    async def main() -> list[list[int]]:
        box: Outbox[int] = Outbox(batch_size=3, capacity=10, flush_interval_s=60)
        for i in range(7):
            await box.put(i)
        groups = [await box.next_group(), await box.next_group()]
        box.close()
        groups += [await box.next_group(), await box.next_group()]
        return groups

    assert asyncio.run(main()) == [[0, 1, 2], [3, 4, 5], [6], []]


def test_a_partial_group_goes_out_once_its_oldest_item_has_waited() -> None:
    async def main() -> tuple[list[int], float]:
        box: Outbox[int] = Outbox(batch_size=100, capacity=100, flush_interval_s=0.05)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await box.put(1)
        await box.put(2)
        group = await box.next_group()
        return group, loop.time() - started

    group, waited = asyncio.run(main())
    assert group == [1, 2]
    assert waited >= 0.05


def test_next_group_waits_for_the_first_item() -> None:
    async def main() -> list[int]:
        box: Outbox[int] = Outbox(batch_size=2, capacity=4, flush_interval_s=60)
        taking = asyncio.create_task(box.next_group())
        await started()
        assert not taking.done()
        await box.put(1)
        await box.put(2)
        return await taking

    assert asyncio.run(main()) == [1, 2]


def test_a_full_outbox_makes_put_wait_until_a_group_is_taken() -> None:
    async def main() -> None:
        box: Outbox[int] = Outbox(batch_size=2, capacity=2, flush_interval_s=60)
        await box.put(1)
        await box.put(2)
        blocked = asyncio.create_task(box.put(3))
        await started()
        assert not blocked.done() and len(box) == 2
        assert box.take() == [1, 2]
        await asyncio.wait_for(blocked, 1)
        assert box.take() == [3]

    asyncio.run(main())


def test_a_cancelled_put_keeps_its_item() -> None:
    async def main() -> list[int]:
        box: Outbox[int] = Outbox(batch_size=1, capacity=1, flush_interval_s=60)
        await box.put(1)
        blocked = asyncio.create_task(box.put(2))
        await started()
        blocked.cancel()
        with pytest.raises(asyncio.CancelledError):
            await blocked
        return box.take() + box.take()

    assert asyncio.run(main()) == [1, 2]


def test_sizes_are_checked() -> None:
    with pytest.raises(ValueError, match="batch_size <= capacity"):
        Outbox[int](batch_size=4, capacity=2, flush_interval_s=1)
