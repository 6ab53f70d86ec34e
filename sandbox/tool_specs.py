"""The four built-in tools as the model sees them: name, description, JSON schema, version.

The schemas are the contract between the protocol parser (`agent/`), which coerces and
validates arguments against them, and the sandbox, which executes them. A tool's
version changes whenever its arguments or its observation format change (seed 000 §3.4:
tool versions go into episode metadata so training can group by them).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class ToolSpec(BaseModel):
    """One tool offered to the agent."""

    model_config = ConfigDict(frozen=True)

    name: str
    """Tool name used in `<tool_call name="…">`."""
    description: str
    """What the tool does, for the system prompt."""
    parameters: dict[str, Any]
    """JSON schema (`type: object`) of the arguments."""
    version: str
    """Version string, bumped when arguments or observations change."""

    def openai_tool(self) -> dict[str, Any]:
        """The spec in OpenAI's `tools=[{"type": "function", …}]` shape."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


EXECUTE_SHELL = ToolSpec(
    name="execute_shell",
    description=(
        "Run a shell command (/bin/sh -c) in the sandbox with /workspace as the working "
        "directory. Returns exit code, stdout and stderr."
    ),
    parameters={
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The shell command to run."},
            "timeout": {
                "type": "integer",
                "description": "Timeout in seconds (default 30, at most the sandbox's limit).",
            },
        },
        "required": ["command"],
        "additionalProperties": False,
    },
    version="1",
)

READ_FILE = ToolSpec(
    name="read_file",
    description="Read a text file inside /workspace and return its content.",
    parameters={
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "Path, absolute or relative to /workspace."},
        },
        "required": ["path"],
        "additionalProperties": False,
    },
    version="1",
)

WRITE_FILE = ToolSpec(
    name="write_file",
    description=(
        "Write content to a file inside /workspace, creating parent directories and "
        "replacing any existing file."
    ),
    parameters={
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "Path, absolute or relative to /workspace."},
            "content": {"type": "string", "description": "The full new content of the file."},
        },
        "required": ["path", "content"],
        "additionalProperties": False,
    },
    version="1",
)

LIST_DIR = ToolSpec(
    name="list_dir",
    description="List a directory inside /workspace: one entry per line, directories end in '/'.",
    parameters={
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "Path, absolute or relative to /workspace."},
        },
        "required": ["path"],
        "additionalProperties": False,
    },
    version="1",
)

BUILTIN_TOOLS: dict[str, ToolSpec] = {
    t.name: t for t in (EXECUTE_SHELL, READ_FILE, WRITE_FILE, LIST_DIR)
}
"""The built-in tools by name."""


def tool_versions(tools: dict[str, ToolSpec] | None = None) -> dict[str, str]:
    """Version of each tool, for episode metadata."""
    return {name: spec.version for name, spec in (tools or BUILTIN_TOOLS).items()}
