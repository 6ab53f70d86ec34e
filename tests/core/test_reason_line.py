"""`core.errors.reason_line`: one line of a reason that keeps its cause."""

from __future__ import annotations

from core.errors import reason_line


def test_a_short_first_line_is_kept_whole() -> None:
    assert reason_line("  disk full\nTraceback ...\n") == "disk full"
    assert reason_line("") == ""
    assert reason_line("\n\n") == ""


def test_a_long_line_keeps_what_failed_and_its_cause() -> None:
    # A collection's storage error under a long temporary path (a pytest-xdist worker's):
    # a cut at the limit lost "No space left on device".
    path = "/tmp/pytest-of-root/pytest-0/popen-gw0/test_storage_errors_of_a_full_0/small"
    text = (
        "object store: cannot write object episodes/full/038ae16c-9404-5e4e-a762-"
        f"2dc86a65093b/trajectory.json under {path}: No space left on device"
    )
    line = reason_line(text, 120)
    assert len(line) == 120
    assert line.startswith("object store: cannot write object")
    assert line.endswith(": No space left on device")
    assert "…" in line
