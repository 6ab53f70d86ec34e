"""Errors of an environment session, each with the `code` a client receives.

SessionError              a session cannot do what was asked (the `code` says which)
├── BadMessage            the client's message is malformed, of an unknown type, too
│                         large, or an action that is not one (`bad_json`,
│                         `unknown_type`, `too_large`, `bad_action`)
├── UnknownTask           the reset names a suite, template or task that does not exist
│                         (`unknown_task`)
├── SessionDone           a step after the episode ended (`episode_done`)
├── WrongSession          a message naming another session (`wrong_session`)
├── NoSession             a step or state before any reset (`no_session`)
├── CapacityReached       every session slot is taken (`capacity`)
├── SessionClosed         the session was closed (idle past its deadline, the client
│                         left, the server stopping) (`closed`)
├── InfrastructureFailure the episode ended for a reason that is not the agent's (the
│                         sandbox, the verifier, storage); never a reward of 0
│                         (`infrastructure`)
└── Unauthorized          a request without the server's bearer token (HTTP 401)

ServeError                the server cannot start as asked (a bind beyond loopback
                          without --allow-remote or a token)
"""

from __future__ import annotations

from typing import ClassVar

from core.errors import EpiflowError


class SessionError(EpiflowError):
    """A session cannot do what was asked; `code` is what the client receives."""

    code: ClassVar[str] = "session_error"


class BadMessage(SessionError):
    """The message is not one this protocol accepts."""

    retryable = False

    def __init__(self, message: str, *, code: str = "bad_action") -> None:
        super().__init__(message)
        self.message_code = code

    @property
    def client_code(self) -> str:
        return self.message_code


class UnknownTask(SessionError):
    """The reset names a suite, template or task that does not exist."""

    code = "unknown_task"
    retryable = False


class SessionDone(SessionError):
    """The episode has ended: no more steps."""

    code = "episode_done"
    retryable = False


class WrongSession(SessionError):
    """The message names a session other than this connection's."""

    code = "wrong_session"
    retryable = False


class NoSession(SessionError):
    """No session yet: reset first."""

    code = "no_session"
    retryable = False


class CapacityReached(SessionError):
    """Every session slot is taken; retry when one frees."""

    code = "capacity"


class SessionClosed(SessionError):
    """The session was closed before its episode ended."""

    code = "closed"


class InfrastructureFailure(SessionError):
    """The episode ended for a reason that is not the agent's; it has no reward."""

    code = "infrastructure"


def client_code(error: SessionError) -> str:
    """The code a client receives for `error`."""
    return error.client_code if isinstance(error, BadMessage) else error.code


class Unauthorized(SessionError):
    """The request lacks the server's bearer token."""

    code = "unauthorized"
    retryable = False


class ServeError(EpiflowError):
    """The server cannot start as asked; `setting` names the option to fix."""

    retryable = False
