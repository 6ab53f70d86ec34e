"""When a run should stop starting episodes because its model endpoint is down.

An endpoint that is down from the start (or goes away mid-run) turns every episode into
`endpoint_error` after the retries, each one costing a sandbox and the backoff. The rule:
once `limit` finished episodes *in a row* ended `endpoint_error`, the run starts no more;
the episodes in flight finish, the ones not started stay unstored, and a re-run of the
key redoes both. Any other outcome resets the streak (a flaky endpoint that still answers
some episodes keeps the run going). Pure: the collection runner feeds it each finished
episode's status and asks `tripped`.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.trajectory import EpisodeStatus
from core.errors import reason_line

__all__ = ["EndpointOutage"]


@dataclass
class EndpointOutage:
    """The streak of `endpoint_error` episodes of one run, and whether it stops the run."""

    limit: int
    """Episodes in a row that stop the run; 0 never stops it."""
    streak: int = 0
    """Finished episodes in a row that ended `endpoint_error`, so far."""
    last_reason: str | None = None
    """The failure reason of the last of them."""
    tripped: bool = False
    """The run must start no more episodes (stays set: an episode in flight that finishes
    well afterwards does not restart a stopped run)."""

    def record(self, status: EpisodeStatus, reason: str | None = None) -> bool:
        """Count one finished episode; True when this one trips the rule (once)."""
        if status == EpisodeStatus.ENDPOINT_ERROR:
            self.streak += 1
            self.last_reason = reason
        else:
            self.streak = 0
        if self.tripped or self.limit <= 0 or self.streak < self.limit:
            return False
        self.tripped = True
        return True

    def message(self, run_key: str) -> str:
        """One line for the log: what happened and what to do."""
        why = reason_line(self.last_reason or "")
        return (
            f"run {run_key}: the model endpoint failed {self.limit} episodes in a row"
            + (f" ({why})" if why else "")
            + "; starting no more episodes. Re-run the key once the endpoint is back."
        )
