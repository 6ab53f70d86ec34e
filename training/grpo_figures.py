"""The figures of one agentic GRPO optimiser step, derived once from TRL's log event.

The terminal's progress line (`training.callbacks.TrainingProgress`) and the train flow's
Prefect artifacts (`flows.train`: the progress artifact's description, a loss table row)
show the same figures, from here:

- `reward`, `reward_std`: TRL's mean and std of the batch's episode rewards;
- `success`: the share of the batch's rollouts with an outcome that succeeded
  (`grpo/success_rate`, infrastructure outcomes aside);
- `kl`, `grad_norm`: TRL's;
- `dropped_zero_variance`, `dropped_infrastructure`, `dropped_gate`: the batch's groups
  dropped, by why (`training.groups`);
- `tokens`: the prompt and completion tokens of the step's rollouts, every one generated
  (trained or dropped: `grpo/rollout_tokens`), what a token budget
  (`TrainingSettings.rl_tokens_per_step`, `training.token_budget`) is compared with;
- `tokens/s`: tokens trained per second since the previous log event (TRL's cumulative
  `num_tokens`; `TokenRate`).

Pure: no TRL, no Prefect.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

__all__ = ["GRPO_DROPS", "TokenRate", "grpo_step_figures", "is_grpo_step", "step_summary"]

GRPO_DROPS = {
    "dropped_zero_variance": "grpo/groups_dropped_zero_variance",
    "dropped_infrastructure": "grpo/groups_dropped_infrastructure",
    "dropped_gate": "grpo/groups_dropped_qc",
}
"""Each figure of groups dropped, and the TRL metric it comes from."""

Figures = dict[str, float | int | None]


def is_grpo_step(logs: Mapping[str, float]) -> bool:
    """Whether a log event is an agentic GRPO step's (it carries the rollout metrics)."""
    return any(k.startswith("grpo/") for k in logs)


class TokenRate:
    """Tokens trained per second between log events, from TRL's cumulative `num_tokens`."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last: tuple[float, float] | None = None

    def __call__(self, logs: Mapping[str, float]) -> float | None:
        """The rate since the previous event that had `num_tokens`; None at the first."""
        tokens, now = logs.get("num_tokens"), self._clock()
        if tokens is None:
            return None
        last, self._last = self._last, (tokens, now)
        if last is None or now <= last[1]:
            return None
        return (tokens - last[0]) / (now - last[1])


def grpo_step_figures(logs: Mapping[str, float], tokens_per_s: float | None) -> Figures:
    """The step's figures (see the module); a figure the event lacks is None."""
    figures: Figures = {
        "reward": logs.get("reward"),
        "reward_std": logs.get("reward_std"),
        "success": logs.get("grpo/success_rate"),
        "kl": logs.get("kl"),
        "grad_norm": logs.get("grad_norm"),
    }
    for name, metric in GRPO_DROPS.items():
        figures[name] = int(logs[metric]) if metric in logs else None
    tokens = logs.get("grpo/rollout_tokens")
    figures["tokens"] = int(tokens) if tokens is not None else None
    figures["tokens/s"] = round(tokens_per_s, 1) if tokens_per_s is not None else None
    return figures


def _number(value: float | int | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _tokens(value: float | int | None) -> str:
    return "-" if value is None else str(int(value))


def step_summary(figures: Figures) -> str:
    """The figures as one phrase: `reward 0.25 ± 0.75, success 0.5, KL 0.01, grad norm 1.5,
    groups dropped 1 zero-variance / 1 infrastructure / 0 gate, 24000 tokens, 250 tokens/s`."""
    dropped = " / ".join(
        f"{_number(figures.get(name))} {name.removeprefix('dropped_').replace('_', '-')}"
        for name in GRPO_DROPS
    )
    return (
        f"reward {_number(figures.get('reward'))} ± {_number(figures.get('reward_std'))}, "
        f"success {_number(figures.get('success'))}, KL {_number(figures.get('kl'))}, "
        f"grad norm {_number(figures.get('grad_norm'))}, groups dropped {dropped}, "
        f"{_tokens(figures.get('tokens'))} tokens, {_number(figures.get('tokens/s'))} tokens/s"
    )
