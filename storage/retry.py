"""Which S3 failures are worth another try, and the retry policy around every S3 call.

Transient (retried with exponential backoff and full jitter, one log line per retry):
connection refused/reset/dropped, timeouts, truncated responses, HTTP 5xx and 429 —
`SlowDown`, `InternalError`, `ServiceUnavailable` as S3 XML, the HTML or empty bodies
a load balancer sends (minio raises `InvalidResponseError` / `ServerError` for those), and
answers whose XML does not parse (a body mangled on the way; a listing's `ParseError`).
Retries stop after the attempts or at the operation's deadline, whichever comes first.

Permanent (raised at once): refused credentials, a missing bucket or key, a bad request,
TLS certificate errors — another try cannot fix them, a settings change can.

Pure logic: no S3 client, no settings object; `storage.objects` wires it to the SDK.
"""

from __future__ import annotations

import http.client
import logging
from collections.abc import Callable
from typing import Any, TypeVar, cast
from xml.etree.ElementTree import ParseError

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_before_delay,
    wait_random_exponential,
)
from tenacity.stop import stop_base

T = TypeVar("T")

log = logging.getLogger("storage.objects")

TRANSIENT_S3_CODES = frozenset(
    {
        "SlowDown",
        "InternalError",
        "ServiceUnavailable",
        "RequestTimeout",
        "IncompleteBody",
        "OperationAborted",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TooManyRequests",
    }
)
"""S3 error codes that name a passing condition of the service, whatever the status."""


def _status_is_transient(status: int | None) -> bool:
    return status is not None and (status >= 500 or status == 429)


def http_status(error: BaseException) -> int | None:
    """The HTTP status an S3 SDK error carries, when it carries one."""
    from minio.error import InvalidResponseError, S3Error, ServerError

    if isinstance(error, S3Error):
        return int(error.response.status) if error.response is not None else None
    if isinstance(error, ServerError):
        return error.status_code
    if isinstance(error, InvalidResponseError):
        # minio keeps the status only in a private field; its pickling contract
        # (`__reduce__`) spells it out as the first argument, so read it from there.
        reduce = cast(Callable[[], tuple[Any, tuple[Any, ...]]], error.__reduce__)
        code = reduce()[1][0]
        return code if isinstance(code, int) else None
    return None


def is_transient(error: BaseException) -> bool:
    """True when the same request may succeed if sent again after a pause."""
    from minio.error import InvalidResponseError, S3Error, ServerError
    from urllib3.exceptions import HTTPError, MaxRetryError, SSLError

    if isinstance(error, S3Error):
        return error.code in TRANSIENT_S3_CODES or _status_is_transient(http_status(error))
    if isinstance(error, ServerError | InvalidResponseError):
        return _status_is_transient(http_status(error))
    if isinstance(error, MaxRetryError):
        # urllib3 wraps the cause; a certificate problem needs a settings fix, not a retry.
        return not isinstance(error.reason, SSLError)
    if isinstance(error, SSLError):
        return False
    if isinstance(error, ParseError):
        return True  # an answer that is not the XML S3 sends: mangled on the way
    # Dropped or refused connections, timeouts, truncated bodies. Other OSErrors (a local
    # file that is missing or unwritable) are not the network's and are not retried.
    return isinstance(error, HTTPError | ConnectionError | TimeoutError | http.client.HTTPException)


def describe(error: BaseException) -> str:
    """A short, secret-free name of a failure for messages: `503 SlowDown`, `ProtocolError`."""
    from minio.error import S3Error
    from urllib3.exceptions import MaxRetryError

    if isinstance(error, MaxRetryError) and error.reason is not None:
        return type(error.reason).__name__  # what went wrong, not that urllib3 gave up
    status = http_status(error)
    if isinstance(error, S3Error):
        return f"{status} {error.code}" if status else str(error.code)
    if status is not None:
        return f"HTTP {status} ({type(error).__name__})"
    return type(error).__name__


def retrying(
    what: str,
    *,
    attempts: int,
    backoff_s: float,
    backoff_max_s: float,
    deadline_s: float | None = None,
) -> Retrying:
    """The retry policy for one S3 operation named `what` (e.g. `upload of episodes/…`).

    Retry n waits a random time in [0, min(backoff_max_s, backoff_s·2^(n-1))] ("full
    jitter"): workers that failed together do not come back together, which is what an S3
    that answered `SlowDown` needs. No retry starts (nor a pause before one) that would
    begin past `deadline_s` seconds from the first attempt. After the last attempt the last
    error is re-raised; `statistics["attempt_number"]` says how many were made.
    """

    def log_retry(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        pause = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning(
            "%s failed (%s); retry %d of %d in %.2f s",
            what,
            describe(error) if error is not None else "?",
            state.attempt_number,
            attempts - 1,
            pause,
        )

    stop: stop_base = stop_after_attempt(attempts)
    if deadline_s is not None:
        stop = stop | stop_before_delay(deadline_s)
    return Retrying(
        stop=stop,
        wait=wait_random_exponential(multiplier=backoff_s, max=backoff_max_s),
        retry=retry_if_exception(is_transient),
        before_sleep=log_retry,
        reraise=True,
    )
