"""A rich progress bar for long CLI runs, fed by polling the run's episode count in SQL
(`count`: the collection's `stored_episodes`).

Polling the database (instead of a callback through the flow) also shows episodes that
other workers' shards write.
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
    with Progress(
        TextColumn("[bold]collecting"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        bar = progress.add_task("episodes", total=total, completed=min(count(), total))

        def poll() -> None:
            while not stop.wait(0.5):
                progress.update(bar, completed=min(count(), total))

        thread = threading.Thread(target=poll, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            progress.update(bar, completed=min(count(), total))
