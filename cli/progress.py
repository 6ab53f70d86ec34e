"""A rich progress bar for long CLI runs, fed by polling the run's episode count in SQL
(`count`: the collection's `stored_episodes`).

Polling the database (instead of a callback through the flow) also shows episodes that
other workers' shards write. A count that cannot be read (the database lost mid-run) stops
the bar where it was; the command reports the failure.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


@contextmanager
def episode_progress(
    count: Callable[[], int], total: int, *, console: Console, enabled: bool = True
) -> Iterator[None]:
    """Show `episodes stored / total` until the block exits."""
    if not enabled:
        yield
        return
    stop = threading.Event()
    last = [0]

    def current() -> int | None:
        """The count, or None when it cannot be read (a database gone mid-run: the
        command itself reports that; the bar only stops moving)."""
        try:
            last[0] = min(count(), total)
        except Exception:
            return None
        return last[0]

    with Progress(
        TextColumn("[bold]collecting"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        bar = progress.add_task("episodes", total=total, completed=current() or 0)

        def poll() -> None:
            while not stop.wait(0.5):
                seen = current()
                if seen is None:
                    return
                progress.update(bar, completed=seen)

        thread = threading.Thread(target=poll, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            progress.update(bar, completed=current() or last[0])
