"""Tables side by side: one helper for every place that maintains several tables at once."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


def each_table(
    items: Sequence[Item], work: Callable[[Item], Result], workers: int, name: str
) -> Iterator[tuple[Item, Result]]:
    """Run ``work`` on every item, ``workers`` at a time, yielding ``(item, result)`` in the
    caller's thread as each finishes. ``work`` must not raise: a failing table fails alone,
    so it returns its failure as a result (the maintainer's operations do)."""
    workers = max(1, min(workers, len(items)))
    if workers == 1:
        for item in items:
            yield item, work(item)
        return
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name) as pool:
        running = {pool.submit(work, item): item for item in items}
        for future in as_completed(running):
            yield running[future], future.result()
