"""The error contract every epiflow package follows.

    EpiflowError                      root: one line for the user, and what to fix
    ├── agent.errors.AgentError
    ├── collection.errors.CollectError
    ├── config.settings.ConfigError
    ├── expectations.errors.ExpectationsError
    ├── sandbox.errors.SandboxError
    ├── scoring.errors.ScoringError
    ├── storage.errors.StorageError
    ├── suites.errors.SuiteError
    └── training.errors.TrainingError

Each package keeps its own tree under its root (see its `errors.py`); callers catch broad
(`EpiflowError`) or narrow. The CLI maps every `EpiflowError` to one line on stderr and
exit code 2 (`cli.app.main`), so a package never needs registering there. Failures that
are data (a failed tool call, an unparseable judge answer, a verifier that scored 0) are
not errors at all: they are recorded on the step or episode.

Retries: an error whose class sets `retryable = False` is in the input itself (an
unknown suite, template or policy, a malformed spec, an invalid setting): running the
same thing again fails the same way. Prefect flows fail such a run once, with the error's
one line and no traceback, and neither a task's nor the flow run's retries run it again
(`orchestration.retries`). Every other error may be an outage and is retried where retries are
declared.

Stops: an error whose class sets `stopped = True` (`training.errors.TrainingStopped`) was
raised because the work was asked to stop (a cancelled flow, a signal), not because it
failed: a run it ends is recorded `interrupted` (`collection.lifecycle.run_ending`).
"""

from __future__ import annotations

from typing import ClassVar


class EpiflowError(Exception):
    """Root of every error epiflow raises on purpose.

    `setting` names what the user should fix: an environment variable
    (`EPIFLOW_DATABASE_URL`), a CLI option (`--faults`) or an input (`suite.yaml`). Messages
    never contain secrets (URLs are redacted before they get here).
    """

    retryable: ClassVar[bool] = True
    """Whether running the same thing again may succeed (False: the input is wrong)."""
    stopped: ClassVar[bool] = False
    """Raised because the work was asked to stop, not because it failed."""

    def __init__(self, message: str = "", *, setting: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting

    def user_message(self) -> str:
        """The problem and what to fix, as one line.

        The first line of the message, followed by the setting when the message does not
        already name it; multi-line messages (e.g. every problem of a `suite.yaml`) keep
        their other lines in `str(error)`, which the CLI prints below this one.
        """
        text = str(self).splitlines()[0] if str(self).strip() else type(self).__name__
        if self.setting and self.setting not in text:
            text = f"{text} (check {self.setting})"
        return text


def reason_line(text: str, limit: int = 200) -> str:
    """The first line of `text`, at most `limit` characters: a reason for one line of
    output or one column. A longer line keeps its start (what failed) and its end (the
    cause, e.g. `: No space left on device`) around an ellipsis: a cut at the limit
    would drop the cause whenever a long path came before it."""
    stripped = text.strip()
    line = stripped.splitlines()[0].strip() if stripped else ""
    if len(line) <= limit:
        return line
    head = (limit - 1) // 2
    return f"{line[:head]}…{line[len(line) - (limit - 1 - head) :]}"
