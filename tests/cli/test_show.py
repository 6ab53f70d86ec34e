"""`epiflow show` on any content: long lines without spaces are clipped with a marker by
default, folded whole with `--full`, and `--raw` prints the stored object unchanged.
(Speed is measured by `bench/show.py`, not here.)"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.text import Text

from agent.trajectory import ParseKind, Step
from cli.show import LINE_CLIP, fit_text, render_trajectory
from cli.terminal import TerminalConsole, neutralise
from storage import migrate
from storage.db import make_engine
from storage.episodes import persist_episodes
from storage.objects import LocalObjectStore
from storage.settings import DatabaseSettings
from tests.storage.builders import make_trajectory

EPIFLOW = str(Path(sys.executable).parent / "epiflow")
LONG = ("0123456789abcdef" * 20_000)[:300_000]  # one 300 KB line, no space


def test_fit_text_clips_by_default_and_folds_in_full() -> None:
    shown = fit_text(LONG + "\nshort line", max_chars=1200, width=80)
    first, second, *_ = shown.split("\n")
    assert first == f"{LONG[:LINE_CLIP]} … [+{1200 - LINE_CLIP} characters on this line]"
    assert second.startswith(f"… ({len(LONG) + 11 - 1200} more characters")
    full = fit_text(LONG + "\nshort line", max_chars=None, width=80)
    lines = full.split("\n")
    assert all(len(line) <= 80 for line in lines)
    assert "".join(lines[:-1]) == LONG and lines[-1] == "short line"


def test_render_prints_markup_and_long_words_as_text() -> None:
    t = make_trajectory(n_steps=2)
    t.steps[0].raw_output = "[bold]not markup[/bold] " + LONG
    sink = io.StringIO()
    render_trajectory(t, Console(file=sink, width=100, soft_wrap=True), max_chars=None)
    out = sink.getvalue()
    assert "[bold]not markup[/bold]" in out
    assert max(len(line) for line in out.splitlines()) <= 100
    assert LONG in out.replace("\n", "")  # folded, nothing lost


def test_cli_show_default_full_and_raw(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'show.db'}"
    engine = make_engine(DatabaseSettings(url=url))
    migrate.upgrade(engine)
    store = LocalObjectStore(tmp_path / "objects")
    store.check()
    t = make_trajectory("show-run", n_steps=2)
    t.steps[0] = Step(
        index=0,
        history_hash="0" * 64,
        raw_output=LONG,
        parse_kind=ParseKind.TOOL_CALL,
        call_id="c0",
        tool="write_file",
        args={"path": "big.txt", "content": LONG},
        observation="ok",
        exit_code=0,
    )
    persist_episodes(engine, store, [t])
    engine.dispose()
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPIFLOW_")}
    env.update(EPIFLOW_DATABASE_URL=url, EPIFLOW_OBJECTS_URL=str(tmp_path / "objects"))

    def show(*args: str) -> str:
        done = subprocess.run(
            [EPIFLOW, "show", str(t.episode_id), *args],
            env=env,
            capture_output=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.decode("utf-8")

    default = show()
    assert "characters on this line]" in default and "--full shows all" in default
    assert len(default) < 20_000
    full = show("--full")
    assert "characters on this line" not in full
    assert "".join(full.split()).count(LONG[:1000]) >= 2  # the message and the arguments
    raw = show("--raw")
    assert json.loads(raw) == json.loads(
        store.get(f"episodes/show-run/{t.episode_id}/trajectory.json")
    )


HOSTILE = (
    "before\x1b[2J\x1b[H"  # clear the screen, cursor home
    "\x1b]0;owned\x07"  # retitle the window
    "\x1b]52;c;ZWNobyBvd25lZA==\x07"  # write the clipboard
    "\x9b31m\x08\r\x00\x7f"  # C1 CSI, backspace, carriage return, NUL, DEL
    "\tafter\nnext line"
)
"""Terminal control sequences a hostile model output or imported file could carry."""


def _assert_neutralised(out: str) -> None:
    data = out.split("before", 1)[1]  # what the data produced, after any styling of ours
    assert not any(c in data for c in "\x1b\x07\x9b\x08\r\x00\x7f"), repr(data[:200])
    assert "␛[2J␛[H" in data and "␛]0;owned" in data and "␛]52;c;ZWNobyBvd25lZA==" in data
    assert "after\nnext line" in data  # newline kept (rich expands the tab into spaces)


def test_neutralise_keeps_length_newline_and_tab() -> None:
    shown = neutralise(HOSTILE)
    assert len(shown) == len(HOSTILE)
    assert shown.count("\n") == 1 and shown.count("\t") == 1
    assert all(not (ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0) for c in shown if c not in "\n\t")


def test_terminal_console_neutralises_data_but_keeps_its_own_styling() -> None:
    sink = io.StringIO()
    console = TerminalConsole(file=sink, width=100, force_terminal=True, color_system="standard")
    console.print(Text("title", style="bold red"))
    console.print(HOSTILE, markup=False, highlight=False)
    out = sink.getvalue()
    assert out.startswith("\x1b[1;31mtitle")  # rich's own escapes still reach the terminal
    _assert_neutralised(out)


def test_cli_show_neutralises_control_sequences(tmp_path: Path) -> None:
    """`epiflow show` on an episode whose texts carry escape sequences: the terminal gets
    visible symbols, never the sequences (the model output, the observation, the prompt, a
    written file's path and the run key all carry them)."""
    url = f"sqlite:///{tmp_path / 'show.db'}"
    engine = make_engine(DatabaseSettings(url=url))
    migrate.upgrade(engine)
    store = LocalObjectStore(tmp_path / "objects")
    store.check()
    t = make_trajectory("show-hostile", n_steps=1)
    t.prompt = HOSTILE
    t.steps[0].raw_output = HOSTILE
    t.steps[0].observation = HOSTILE
    t.failure_reason = HOSTILE
    persist_episodes(engine, store, [t])
    engine.dispose()
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPIFLOW_")}
    env.update(EPIFLOW_DATABASE_URL=url, EPIFLOW_OBJECTS_URL=str(tmp_path / "objects"))
    for args in ((), ("--full",)):
        # Output to a pipe carries no styling of rich's: any control character is the data's.
        done = subprocess.run(
            [EPIFLOW, "show", str(t.episode_id), *args], env=env, capture_output=True, timeout=300
        )
        assert done.returncode == 0, done.stderr
        out = done.stdout.decode("utf-8")
        assert not [c for c in out if c != "\n" and (ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0)]
        # prompt, model output, observation and the failure reason, each visibly
        assert out.count("␛[2J␛[H") >= 4 and out.count("␛]52;c;ZWNobyBvd25lZA==") >= 4
