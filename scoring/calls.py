"""What a step did, in terms the reward rules and the rule judge share.

A call's *signature* (tool + canonical args) decides "repeated identical call"; its
*target* (normalised path, or the shell command) decides "new path explored"; the
*workspace epoch* (how many steps changed files before it) decides whether repeating a
call could have produced a different result.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Sequence

from agent.trajectory import ParseKind, Step, Trajectory

__all__ = [
    "OBSERVING_TOOLS",
    "PROMPT_PATH_PATTERN",
    "TRANSIENT_ERROR_TYPES",
    "WORKSPACE_ROOT",
    "RepeatedCalls",
    "blind_write_steps",
    "call_signature",
    "call_target",
    "is_format_error",
    "is_transient_failure",
    "normalize_path",
    "prompt_inputs",
    "prompt_paths",
    "repeated_call_steps",
    "simple_path",
    "write_path",
]

WORKSPACE_ROOT = "/workspace"
"""Mount point of the task's workspace inside the jail."""

OBSERVING_TOOLS = frozenset({"read_file", "list_dir", "execute_shell"})
"""Tools whose result shows the agent something about the workspace."""

TRANSIENT_ERROR_TYPES = frozenset({"timeout", "network_failure"})
"""Failures a retry can fix: retrying them is recovery, not repetition."""


def normalize_path(path: str) -> str:
    """Workspace-relative, normalised form of a path argument (`/workspace/a/../b` → `b`)."""
    p = path.strip()
    if p == WORKSPACE_ROOT or p.startswith(WORKSPACE_ROOT + "/"):
        p = p[len(WORKSPACE_ROOT) :]
    p = posixpath.normpath(p.lstrip("/")) if p.strip("/") else "."
    return p


def is_format_error(step: Step) -> bool:
    """The message did not parse into a call or a final (protocol/schema error, or no block)."""
    return step.parse_kind in (ParseKind.ERROR, ParseKind.NONE) or step.parse_error is not None


def call_signature(step: Step) -> str | None:
    """tool + canonical JSON args of a parsed call; None when the step made no call."""
    if (
        step.parse_kind is not ParseKind.TOOL_CALL
        or step.tool is None
        or step.parse_error is not None
    ):
        return None
    args = dict(step.args or {})
    if isinstance(args.get("command"), str):
        # Whitespace does not change what a shell command does.
        args["command"] = " ".join(args["command"].split())
    if isinstance(args.get("path"), str):
        args["path"] = normalize_path(args["path"])
    return step.tool + json.dumps(args, sort_keys=True, ensure_ascii=False, default=str)


def call_target(step: Step) -> str | None:
    """What the call explores: the normalised path, or `$ <command>` for the shell."""
    if call_signature(step) is None:
        return None
    args = step.args or {}
    if isinstance(args.get("path"), str):
        return normalize_path(args["path"])
    if isinstance(args.get("command"), str):
        return "$ " + " ".join(args["command"].split())
    return None


def is_transient_failure(step: Step) -> bool:
    """The call failed for a reason outside the agent's control (injected fault, timeout)."""
    return (
        step.injected_fault is not None
        or step.timed_out
        or step.error_type in TRANSIENT_ERROR_TYPES
    )


def repeated_call_steps(steps: Sequence[Step]) -> list[int]:
    """Indices of calls identical to the previous identical call with no workspace change in between.

    "In between" excludes the earlier call's own changes: writing the same file with the
    same content twice is a repeat. A retry after a transient failure (injected fault,
    timeout, network failure) is recovery and does not count.
    """
    calls = RepeatedCalls()
    return [step.index for step in steps if calls.add(step)]


class RepeatedCalls:
    """`repeated_call_steps` one step at a time, in step order (the one rule: that
    function is this class over a whole episode); a session rewards each step as it
    comes without going over the earlier ones again."""

    def __init__(self) -> None:
        self._latest: dict[str, tuple[Step, int]] = {}
        self._changes = 0

    def add(self, step: Step) -> bool:
        """Whether `step`, following the steps added before it, repeats a call."""
        sig = call_signature(step)
        repeated = False
        if sig is not None:
            earlier = self._latest.get(sig)
            repeated = (
                earlier is not None
                and earlier[1] == self._changes
                and not is_transient_failure(earlier[0])
            )
        if step.files_changed:
            self._changes += 1
        if sig is not None:
            self._latest[sig] = (step, self._changes)
        return repeated


FILE_EXTENSIONS = (
    "csv|tsv|json|jsonl|ndjson|txt|log|md|rst|py|sh|bash|yaml|yml|toml|ini|cfg|conf|xml|html|htm|"
    "sql|js|ts|gz|bz2|xz|zip|tar|tgz|parquet|db|sqlite|dat|bin|out|err|bak|lock|pem|env|c|h|go|rs|java|rb"
)
"""File extensions that make a prompt token a path (so `server.port` in a prompt is not one)."""

# Path-like tokens in a task prompt: anything under /workspace, or a (relative) name with a
# known file extension. No look-arounds, so the same pattern also runs in polars (Rust regex).
PROMPT_PATH_PATTERN = (
    r"/workspace(?:/[\w.-]*[\w-])+/?|(?:[\w.-]+/)*[\w.-]*[\w-]\.(?:" + FILE_EXTENSIONS + r")\b"
)
"""Regex for path-like tokens in a prompt."""


def simple_path(path: str) -> str:
    """Cheap normal form used to compare prompt paths and call paths (no `..` folding); root is ``""``."""
    p = path.strip()
    if p.startswith(WORKSPACE_ROOT):
        p = p[len(WORKSPACE_ROOT) :]
    while p.startswith("./"):
        p = p[2:]
    p = p.strip("/")
    return "" if p == "." else p


def prompt_paths(prompt: str) -> list[str]:
    """Distinct path-like tokens of a prompt, in `simple_path` form."""
    out: list[str] = []
    for token in re.findall(PROMPT_PATH_PATTERN, prompt):
        p = simple_path(token)
        if p and p not in out:
            out.append(p)
    return out


_OUTPUT_CUES = frozenset(
    {
        "write",
        "writes",
        "writing",
        "to",
        "into",
        "save",
        "saving",
        "create",
        "creating",
        "output",
        "produce",
        "generate",
        "as",
        "list",
        "listing",
    }
)
# "in" is no cue: "in /workspace/…" names inputs and outputs alike.
_CUE = re.compile(
    r"\b(write|writes|writing|to|into|save|saving|create|creating|output|produce|generate|as|list|listing|"
    r"read|from|of|parse|load|open|convert|merge|copy|count|sum|given|using|has|holds|contains|check|find|fix|under)\b",
    re.IGNORECASE,
)


def prompt_inputs(prompt: str) -> list[str]:
    """The prompt's paths that read as inputs, in `simple_path` form.

    The last cue word before a path in its sentence decides: `write … to out.txt`,
    `into`, `save … as`, `list … ` make it an output; `of data.csv`, `from`, `convert`,
    or no cue at all make it an input. Deliberately simple: an output misread as an
    input only matters when the episode never writes it.
    """
    out: list[str] = []
    for m in re.finditer(PROMPT_PATH_PATTERN, prompt):
        clause = re.split(r"[.!?;]\s", prompt[: m.start()])[-1]
        cues = _CUE.findall(clause)
        if cues and cues[-1].lower() in _OUTPUT_CUES:
            continue
        p = simple_path(m.group(0))
        if p and p not in out:
            out.append(p)
    return out


def write_path(step: Step) -> str | None:
    """`simple_path` of a parsed `write_file` call's target; None for any other step."""
    if call_signature(step) is None or step.tool != "write_file":
        return None
    path = (step.args or {}).get("path")
    return simple_path(path) if isinstance(path, str) else None


def _touched(path: str, earlier: Sequence[Step], *, listing_counts: bool) -> bool:
    """Did an earlier call read `path` (or, for inputs, list it or its directory)?"""
    parent = posixpath.dirname(path)
    base = posixpath.basename(path)
    for step in earlier:
        if call_signature(step) is None:
            continue
        args = step.args or {}
        raw = args.get("path")
        target = simple_path(raw) if isinstance(raw, str) else None
        if (
            step.tool == "read_file"
            and target is not None
            and (target == path or target.startswith(path + "/"))
        ):
            return True
        if listing_counts and step.tool == "list_dir" and target in (path, parent):
            return True
        command = args.get("command")
        if step.tool == "execute_shell" and isinstance(command, str) and base and base in command:
            return True
    return False


def blind_write_steps(trajectory: Trajectory) -> list[int]:
    """`write_file` calls made before reading or listing their inputs (seed 000 §3.3 logic).

    The inputs of a write are the paths the prompt names as inputs (`prompt_inputs`) that
    the episode never writes (and that are not the written file's directory), plus the
    written file itself when the write modified an existing file. An input counts as seen once an earlier call read it,
    listed it or its directory, or named it in a shell command. A task whose prompt names
    no input has nothing to read first.
    """
    steps = trajectory.steps
    written = {p for s in steps if (p := write_path(s)) is not None}
    written |= {simple_path(c.path) for s in steps for c in s.files_changed}
    mentioned = prompt_inputs(trajectory.prompt)
    blind: list[int] = []
    for pos, step in enumerate(steps):
        target = write_path(step)
        if target is None:
            continue
        earlier = steps[:pos]
        inputs = [p for p in mentioned if p not in written and not target.startswith(p + "/")]
        modifies = any(
            c.change == "modified" and simple_path(c.path) == target for c in step.files_changed
        )
        if any(not _touched(p, earlier, listing_counts=True) for p in inputs) or (
            modifies and not _touched(target, earlier, listing_counts=False)
        ):
            blind.append(step.index)
    return blind
