"""Agent errors. A failed *tool call* is data on a step; these are the agent's own failures.

AgentError
├── ProtocolError          the assistant message breaks protocol v1 (→ `<tool_error>`, never fatal alone)
├── PolicyError            the policy could not produce an answer (→ episode `policy_error`)
│   ├── PolicyTimeout      the policy did not answer in time
│   ├── PolicyHTTPError    the endpoint refused the request (HTTP 400, 413, 422: e.g. the
│   │                      history outgrew the model's context)
│   ├── PolicyResponseError the answer is unusable (larger than the body cap)
│   ├── PolicyLoadError    a local checkpoint could not be loaded
│   └── EndpointError      the model endpoint failed (→ episode `endpoint_error`, an
│       │                  infrastructure outcome: never the agent's, redone by a re-run)
│       ├── EndpointTimeout       requests timed out, after the retries
│       ├── EndpointHTTPError     429/5xx after the retries, or 401/403/404 (misconfigured)
│       └── EndpointResponseError 2xx bodies that were not a chat completion, after the retries
├── PolicySpecError        a policy spec string is malformed or names an unknown policy
├── ServeAddressError      a serving front cannot listen on the host and port asked for
└── TokenStreamError       an episode's recorded token ids do not form one prefix-extending
                           stream (a step without ids, a prompt that does not extend the last)
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


class EndpointError(PolicyError):
    """The model endpoint could not give a chat completion: it is down, overloaded,
    misconfigured or answering garbage. Infrastructure, never the agent's: the episode ends
    `endpoint_error`, and preflight raises it when the endpoint does not answer at all."""

    def __init__(self, message: str, *, endpoint: str, attempts: int = 1) -> None:
        PolicyError.__init__(self, message, setting="--policy")
        self.endpoint = endpoint
        """The base URL of the endpoint."""
        self.attempts = attempts
        """Requests made before giving up."""


class EndpointTimeout(EndpointError, PolicyTimeout):
    """Every attempt timed out."""


class EndpointHTTPError(EndpointError, PolicyHTTPError):
    """The endpoint answered 429/5xx on every attempt, or 401/403/404."""

    def __init__(self, message: str, *, endpoint: str, attempts: int, status_code: int) -> None:
        EndpointError.__init__(self, message, endpoint=endpoint, attempts=attempts)
        self.status_code = status_code


class EndpointResponseError(EndpointError, PolicyResponseError):
    """The endpoint answered 2xx on every attempt, never with a chat completion (an HTML
    error page, a body that is not JSON, JSON without `choices`…)."""


class PolicySpecError(AgentError, ValueError):
    """A policy spec string (`scripted:oracle`, `openai:…`, `hf:…`) is invalid."""

    retryable = False


class ServeAddressError(AgentError):
    """A serving front (`agent.serving_proxy`) cannot listen where asked: the port is
    taken or the host is not this machine's."""

    retryable = False


class TokenStreamError(AgentError):
    """An episode's recorded token ids cannot be read as one stream (`episode_tokens`)."""
