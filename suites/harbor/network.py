"""What in a Harbor task needs the internet: the one place these rules live.

Three questions, each answered from what the task declares or runs as written, never from
its prose:

- **at build time** (`build_fetch`): a `RUN` step that fetches from the internet beyond
  the package registries the build reaches (Debian's apt, PyPI through pip/uv): `git
  clone`/`fetch`/`pull`, `curl`/`wget` of a URL (installer scripts such as
  `astral.sh/uv/install.sh` or `sh.rustup.rs` included), `pip install git+https://…`,
  `uv python install` (Pythons from GitHub), a model or data set from the Hugging Face hub
  (`from_pretrained(…)`, `hf_hub_download`, `snapshot_download`, `load_dataset(…)` of
  anything but a quoted local path or a file loader such as `"json"`, `huggingface-cli
  download`). The step is read as its shell runs it: with the Dockerfile's `ARG`/`ENV`
  values substituted (`ARG URL=https://…` then `RUN curl "$URL"`), and a script of the
  build context that a `COPY` put in the image and the step runs (`RUN bash
  /app/setup.sh` whose `setup.sh` does `git clone`) is read line by line
  (`build_script_fetch`; one level: a script that script calls is not followed). Such a
  task is refused up front (`network-build`) rather than failing its build.
- **for the agent** (`agent_network`): `task.toml` names hosts the agent reaches
  (`allowed_hosts` or `network_mode = "allowlist"` in `[agent]` or `[environment]`), or a
  remote MCP server (`[[environment.mcp_servers]]` with a `url`), or the reference
  solution (`solution/solve.sh`) downloads (the fetches above, or a package install: the
  agent's jail has no network and its user is not root). `allow_internet = true` and
  `network_mode = "public"` are Harbor's default permission, not a need: they are not
  refused (Terminal-Bench's task template writes `allow_internet = true` for every task).
- **for the verifier** (`verifier_fetch`): a script of `tests/` fetches from an internet
  host at verify time (`urllib.request.urlretrieve("https://github.com/…")`); the offline
  toolkit serves the uv installer and the pinned requirements, nothing else.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from suites.harbor.texts import folder_texts

_FETCHES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\bgit\s+(?:-\S+\s+)*(clone|fetch|pull|submodule\s+update)\b"), "git {0}"),
    (re.compile(r"\bgit\+(?:https?|ssh)://"), "a git+ URL"),
    (re.compile(r"\b(curl|wget)\b[^;&|\n]*?\b(?:https?|ftp)://([^/\s'\"]+)"), "{0} of {1}"),
    (re.compile(r"\buv\s+python\s+install\b"), "uv python install (Pythons from GitHub)"),
    (re.compile(r"\b(from_pretrained|hf_hub_download|snapshot_download)\(\s*(?!['\"][./~])"),
     "{0} from the Hugging Face hub"),
    (re.compile(r"\bload_dataset\(\s*(?!['\"](?:[./~]|(?:csv|json|parquet|text|arrow|imagefolder)['\"]))"),
     "load_dataset from the Hugging Face hub"),
    (re.compile(r"\b(?:huggingface-cli|hf)\s+download\b"), "a Hugging Face hub download"),
)  # fmt: skip
"""Fetches from the internet beyond the package registries."""
_INSTALLS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\b(?:pip3?|uv\s+pip|python3?\s+-m\s+pip)\s+install\b(?![^;&|\n]*--no-index)"),
     "pip install"),
    (re.compile(r"\bapt(?:-get)?\s+(?:-\S+\s+)*install\b"), "apt-get install"),
    (re.compile(r"\b(?:npm|pnpm|yarn)\s+(?:install|add|i)\b"), "npm install"),
    (re.compile(r"\bcargo\s+(?:install|fetch)\b"), "cargo install"),
    (re.compile(r"\bgo\s+(?:install|get|mod\s+download)\b"), "go install"),
)  # fmt: skip
"""Package installs: the build reaches their registries, the agent's jail does not."""


def build_fetch(command: str) -> str | None:
    """What in a build's shell `command` fetches from the internet; None when nothing does."""
    return _first(command, _FETCHES)


def build_script_fetch(text: str) -> tuple[int, str] | None:
    """(line, what) of the first internet fetch in a build-context script a `RUN` step
    runs; package installs are not counted (the build reaches the registries)."""
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("#"):
            continue
        found = _first(line, _FETCHES)
        if found:
            return number, found
    return None


def script_fetch(text: str) -> tuple[int, str] | None:
    """(line, what) of the first download in a script run by the agent (a reference
    solution): an internet fetch or a package install; None when it has none."""
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("#"):
            continue
        found = _first(line, _FETCHES) or _first(line, _INSTALLS)
        if found:
            return number, found
    return None


def agent_network(environment: dict[str, Any], agent: dict[str, Any]) -> tuple[str, str] | None:
    """(field, what) when `task.toml` declares that the agent needs the network."""
    for name, table in (("agent", agent), ("environment", environment)):
        hosts = table.get("allowed_hosts")
        if isinstance(hosts, list) and hosts:
            return f"{name}.allowed_hosts", f"the agent reaches {', '.join(map(str, hosts))}"
        if table.get("network_mode") == "allowlist":
            return f"{name}.network_mode", "an allowlist of hosts the agent reaches"
    servers = environment.get("mcp_servers")
    for server in servers if isinstance(servers, list) else []:
        if isinstance(server, dict) and server.get("url"):
            return "environment.mcp_servers", f"the agent talks to the MCP server {server['url']}"
    return None


def solution_fetch(task_dir: Path) -> tuple[Path, int, str] | None:
    """(file, line, what) of the first download in the task's `solution/solve.sh`."""
    path = task_dir / "solution" / "solve.sh"
    if not path.is_file():
        return None
    found = script_fetch(path.read_text(encoding="utf-8", errors="replace"))
    return (path, *found) if found else None


def _first(text: str, patterns: tuple[tuple[re.Pattern[str], str], ...]) -> str | None:
    for pattern, what in patterns:
        match = pattern.search(text)
        if match:
            return what.format(*match.groups())
    return None


_URL = re.compile(r"\b(?:https?|ftp)://([A-Za-z0-9.-]+)")
_LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "0.0.0.0", "::1"})
_SHIMMED_URL = re.compile(r"https://astral\.sh/uv/")
_FETCH_CALL = re.compile(
    r"\b(?:urlretrieve|urlopen|requests\.(?:get|post|head)|httpx\.(?:get|post|stream)|"
    r"wget|curl|git\s+clone|hf_hub_download|snapshot_download|from_pretrained|load_dataset)\b"
)
_SCRIPTS = frozenset({".sh", ".bash", ".py"})
_ASSIGNED = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=")


def verifier_fetch(tests_dir: Path) -> tuple[Path, int, str] | None:
    """(file, line, host) of the first internet host a verifier fetches from at verify time:
    an `http(s)://` URL of a host other than loopback on a line of a `tests/` script that
    calls a fetch (`urlopen`, `urlretrieve`, `requests.get`, `curl`, `wget`, `git clone`, a
    Hugging Face download), or assigned to a name such a line uses (`url = "https://…"` …
    `urlretrieve(url, …)`); the uv installer, which the offline toolkit serves, aside.
    Scripts only (`.sh`, `.py`): a data file naming a URL fetches nothing."""
    for path, text in folder_texts(tests_dir, _SCRIPTS):
        lines = text.splitlines()
        fetching = [ln for ln in lines if _FETCH_CALL.search(ln) and not _SHIMMED_URL.search(ln)]
        for number, line in enumerate(lines, 1):
            if line.lstrip().startswith("#") or _SHIMMED_URL.search(line):
                continue
            hosts = [h for h in _URL.findall(line) if h not in _LOCAL_HOSTS]
            if not hosts:
                continue
            named = _ASSIGNED.match(line)
            if _FETCH_CALL.search(line) or (
                named and any(re.search(rf"\b{named.group(1)}\b", ln) for ln in fetching)
            ):
                return path, number, hosts[0]
    return None
