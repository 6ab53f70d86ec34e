"""A workspace's shape (permission bits, folders, symlinks) survives export → populate
(issue 44: a Harbor verifier looks at what the agent left, e.g. a key's mode 0600, an
executable, git's empty `refs/` folders), on real jails."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

import pytest

from sandbox import TransferError
from sandbox.transfer import WorkdirShape, shape_from_dir
from tests.sandbox.conftest import Jails

MAKE = (
    "mkdir -p repo/refs/heads repo/refs/tags secret && chmod 700 secret && "
    "printf k > secret/key && chmod 600 secret/key && "
    "printf '#!/bin/sh\\necho ran\\n' > run.sh && chmod 755 run.sh && "
    "ln -s run.sh again.sh && ln -s /etc/hostname outside"
)
CHECK = (
    "stat -c '%n %a' secret secret/key run.sh repo/refs/tags && "
    "readlink again.sh outside && ./again.sh"
)


def test_export_carries_the_shape_and_populate_gives_it_back(jails: Jails, tmp_path: Path) -> None:
    async def body() -> None:
        async with await jails.open() as box:
            made = await box.exec(["/bin/sh", "-c", MAKE])
            assert made.exit_code == 0, made.stderr
            report = await box.export(tmp_path / "out")
        shape = report.shape
        assert shape.modes == {"secret/key": 0o600, "run.sh": 0o755}
        assert shape.dirs["repo/refs/tags"] == 0o755 and shape.dirs["secret"] == 0o700
        assert shape.symlinks == {"again.sh": "run.sh", "outside": "/etc/hostname"}
        # the host copy holds bytes only: nothing of the shape is written on the host
        assert not (tmp_path / "out" / "again.sh").exists()
        files = {
            p.relative_to(tmp_path / "out").as_posix(): p.read_bytes()
            for p in (tmp_path / "out").rglob("*")
            if p.is_file()
        }
        async with await jails.open(files=files) as again:
            await again.populate({}, shape=shape)
            seen = await again.exec(["/bin/sh", "-c", CHECK])
        assert seen.exit_code == 0, seen.stderr
        assert seen.stdout.decode().splitlines() == [
            "secret 700",
            "secret/key 600",
            "run.sh 755",
            "repo/refs/tags 755",
            "run.sh",
            "/etc/hostname",
            "ran",
        ]

    asyncio.run(body())


def test_a_file_the_owner_cannot_read_stays_readable(jails: Jails) -> None:
    """The jail user is not root: bits that would lock it out of its own file are kept
    readable (a root verifier reads them regardless)."""

    async def body() -> None:
        async with await jails.open(files={"locked": "x", "box/inner": "y"}) as box:
            await box.populate({}, shape=WorkdirShape(modes={"locked": 0o000}, dirs={"box": 0}))
            seen = await box.exec(["/bin/sh", "-c", "stat -c '%a' locked box && cat box/inner"])
        assert seen.stdout.decode().split() == ["400", "500", "y"]

    asyncio.run(body())


def test_a_shape_path_outside_the_workspace_is_refused(jails: Jails) -> None:
    async def body() -> None:
        async with await jails.open() as box:
            with pytest.raises(TransferError, match="unsafe workspace path"):
                await box.populate({}, shape=WorkdirShape(symlinks={"../x": "/etc"}))
            await box.exec(["/bin/sh", "-c", "ln -s /etc link"])
            with pytest.raises(TransferError, match="link/passwd"):
                await box.populate({}, shape=WorkdirShape(modes={"link/passwd": 0o777}))

    asyncio.run(body())


def test_shape_from_dir_reads_a_host_folder(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "tool").write_text("#!/bin/sh\n")
    (tmp_path / "tool").chmod(0o750)
    (tmp_path / "plain").write_text("x")
    (tmp_path / "plain").chmod(0o644)
    (tmp_path / "link").symlink_to("tool")
    shape = shape_from_dir(tmp_path, limit=100)
    assert shape.modes == {"tool": 0o750}
    assert shape.dirs == {"empty": stat.S_IMODE((tmp_path / "empty").stat().st_mode)}
    assert shape.symlinks == {"link": "tool"}
    assert shape_from_dir(tmp_path, limit=0).is_empty()
