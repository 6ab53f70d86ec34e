"""Agent errors. A failed *tool call* is data on a step; these are the agent's own failures.

AgentError
├── ProtocolError          the assistant message breaks protocol v1 (→ `<tool_error>`, never fatal alone)
├── PolicyError            the policy could not produce an answer (→ episode `policy_error`)
│   ├── PolicyTimeout      the request timed out (after retries)
│   ├── PolicyHTTPError    the endpoint answered with an HTTP error (after retries for 429/5xx)
│   ├── PolicyResponseError the endpoint answered, but not with a usable chat completion
│   └── PolicyLoadError    a local checkpoint could not be loaded
└── PolicySpecError        a policy spec string is malformed or names an unknown policy
"""

from __future__ import annotations

from core.errors import EpiflowError


class AgentError(EpiflowError):
    """Base class of every error raised by `agent/`."""


class ProtocolError(AgentError):
    """The assistant message is not valid protocol v1.

    The message is written for the model (it goes back inside `<tool_error>`), so it names
    the tool, the arg and what was expected whenever they are known.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str,
        tool: str | None = None,
        arg: str | None = None,
        call_id: str | None = None,
        offset: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        """Human (and model) readable description of the violation."""
        self.code = code
        """Stable machine code, e.g. `unknown_tool`, `missing_arg`, `bad_value` (see docs/protocol.md)."""
        self.tool = tool
        """Tool name when the violation is inside a call whose name was read."""
        self.arg = arg
        """Arg name when the violation concerns one arg."""
        self.call_id = call_id
        """Call id when it was read before the violation."""
        self.offset = offset
        """Character offset in the message where the violation was found, when known."""

    def __repr__(self) -> str:
        return f"ProtocolError(code={self.code!r}, message={self.message!r})"


class PolicyError(AgentError):
    """The policy failed to answer; the episode ends as `policy_error` with this reason."""


class PolicyTimeout(PolicyError):
    """The policy request timed out (after the configured retries)."""


class PolicyHTTPError(PolicyError):
    """The endpoint answered with an HTTP error status."""

    def __init__(self, message: str, *, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code
        """The last HTTP status code received."""


class PolicyResponseError(PolicyError):
    """The endpoint answered 2xx but the body is not a usable chat completion."""


class PolicyLoadError(PolicyError):
    """A local model checkpoint could not be loaded."""


class PolicySpecError(AgentError, ValueError):
    """A policy spec string (`scripted:oracle`, `openai:…`, `hf:…`) is invalid."""
