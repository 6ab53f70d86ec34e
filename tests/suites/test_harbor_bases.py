"""`suites/harbor/bases.py`: which `FROM` images are built as another distribution, Debian
codename or Python version than their tag names (a substituted base), and the one line that
says so (fast: nothing is built)."""

from __future__ import annotations

from pathlib import Path

import pytest

from suites.harbor.bases import map_base


@pytest.mark.parametrize(
    ("image", "substituted"),
    [
        # ubuntu: always another distribution
        ("ubuntu:24.04", "ubuntu:24.04 built as Debian trixie"),
        ("ubuntu:22.04", "ubuntu:22.04 built as Debian bookworm"),
        # python: the codename the tag names, or the Python version, differs
        ("python:3.13-slim-bookworm", "python:3.13-slim-bookworm built as Debian trixie (Python 3.13)"),
        ("python:3.12", "python:3.12 built as Debian trixie (Python 3.13)"),
        ("python:3.12-slim-trixie", "python:3.12-slim-trixie built as Debian trixie (Python 3.13)"),
        ("python:3.10-slim-bookworm", "python:3.10-slim-bookworm built as Debian bookworm (Python 3.11)"),
        ("python:3.11-trixie", "python:3.11-trixie built as Debian bookworm (Python 3.11)"),
        # python: built as named (a tag without a codename or a minor version names none)
        ("python:3.13-slim-trixie", None),
        ("python:3.13-slim", None),
        ("python:3.11-slim-bookworm", None),
        ("python:3.11-slim", None),
        ("python:bookworm", None),
        ("python:3", None),
        ("python:latest", None),
        # debian: by codename or version number, always as named
        ("debian:trixie", None),
        ("debian:13", None),
        ("debian:12.5-slim", None),
        ("debian:bookworm-slim", None),
        ("debian:stable", None),
        ("debian:bookworm@sha256:0123456789abcdef0123456789abcdef", None),
    ],
)  # fmt: skip
def test_a_base_is_substituted_when_its_distribution_codename_or_python_differs(
    image: str, substituted: str | None
) -> None:
    mapping = map_base(image, Path("Dockerfile"), 1)
    assert mapping.substituted == substituted
    if substituted is not None:
        assert mapping.release in substituted and "\n" not in substituted


def test_the_parsed_plan_carries_the_substitution(tmp_path: Path) -> None:
    from suites.harbor.dockerfile import parse_dockerfile

    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("FROM python:3.13-slim-bookworm\nWORKDIR /app\n")
    plan = parse_dockerfile(dockerfile)
    assert plan.base_substitution == (
        "python:3.13-slim-bookworm built as Debian trixie (Python 3.13)"
    )
    dockerfile.write_text("FROM debian:13\nWORKDIR /app\n")
    assert parse_dockerfile(dockerfile).base_substitution is None
