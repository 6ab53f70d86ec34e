"""Per-turn advantages in TRL's GRPO loss: a mixin over `GRPOTrainer` (opt-in).

With `TrainingSettings.returns_gamma` set, `run_episode_grpo` trains with
`type(…, (StepReturnsMixin, GRPOTrainer), {})`. TRL (1.16) computes one advantage per
rollout, shape (B,), in `_generate_and_score_completions`; its `_compute_loss` also takes
advantages of shape (B, T) ("to support subclasses that provide advantages with shape
(B, T), we conditionally unsqueeze"), and every step after it (the shuffle and split of
the generation batch into micro-batches, the clipped objective, the clip-ratio metrics)
works row-wise on either shape. So the mixin lets TRL score the batch as usual, then
replaces `advantages` with a (B, T) tensor: row b is slot b's completion, each token with
its turn's advantage A_{i,t} (`training.returns`, judged by `EpisodeRollouts` for this
batch and recorded with each episode), 0 on a dropped or discarded slot and on padding.

Alignment: TRL pads `completion_ids` on the right (to the batch's longest, or
`pad_to_multiple_of`) and, on the `rollout_func` path, never truncates them, so token k
of a slot's `TokenRollout.completion_ids` is column k; the mixin checks that the ids TRL
scored are the rollout function's, slot by slot, and refuses to train otherwise.
Observation tokens carry their turn's advantage too, but `env_mask` keeps them out of
the loss as before.

What TRL logs: the rewards (`reward`, `reward_std`, `rewards/episode_reward/…`) stay the
episodes' total rewards, so runs with and without per-turn returns log comparable
rewards; `frac_reward_zero_std` is TRL's view of those total rewards (a group whose
successes differ only in length counts there as zero-std though the returns train it);
the completions table's `advantage` column (one number per rollout) gets A_{i,0}, the
advantage stored with the episode, instead of TRL's episode-level one.
"""

from __future__ import annotations

from typing import Any

from training.errors import TrainerError
from training.returns import token_advantages
from training.trainers.episode_grpo import EpisodeRollouts, JudgedBatch

__all__ = ["StepReturnsMixin", "slot_advantages", "slot_start_advantages"]


def slot_advantages(judged: JudgedBatch) -> list[list[float]]:
    """Each batch slot's advantage per completion token, in the rollout function's slot
    order: a trained rollout's tokens get their turn's advantage, any other slot (its
    one-token placeholder) 0.0.

    Raises:
        TrainerError: a trained group has no per-turn advantages (judged without
            `returns_gamma`), or a rollout has more turns than advantages.
    """
    out: list[list[float]] = []
    for group, rollouts in zip(judged.groups, judged.rollouts, strict=True):
        if group.trained and group.turn_advantages is None:
            raise TrainerError(
                f"group of task {group.task_id} was judged without per-turn returns: "
                "EpisodeRollouts needs returns_gamma for StepReturnsMixin"
            )
        for i, rollout in enumerate(rollouts):
            turns = group.turn_advantages[i] if group.turn_advantages else None
            if rollout is None or turns is None:
                out.append([0.0])  # the placeholder's one token, masked
            else:
                out.append(token_advantages(rollout, turns))
    return out


def slot_start_advantages(judged: JudgedBatch) -> list[float]:
    """Each slot's stored advantage (its first turn's, A_{i,0}; 0.0 when not trained)."""
    return [
        a if group.advantages is not None and (a := group.advantages[i]) is not None else 0.0
        for group in judged.groups
        for i in range(len(group.trajectories))
    ]


class StepReturnsMixin:
    """Put before `trl.GRPOTrainer` in the bases: trains every token with its turn's
    advantage (see the module). The trainer's `rollout_func` must be the
    `EpisodeRollouts` built with `returns_gamma`."""

    rollout_func: Any
    accelerator: Any
    _logs: Any

    def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
        """TRL's scored generation batch, its `advantages` one per token.

        Raises:
            TrainerError: the rollout function is not `EpisodeRollouts`, or the batch TRL
                scored is not the one it last returned.
        """
        import torch

        output: dict[str, Any] = super()._generate_and_score_completions(inputs)  # type: ignore[misc]
        rollouts = self.rollout_func
        if not isinstance(rollouts, EpisodeRollouts) or rollouts.last is None:
            raise TrainerError(
                "StepReturnsMixin needs GRPOTrainer(rollout_func=EpisodeRollouts(…)) that "
                "generated this batch"
            )
        judged = rollouts.last
        per_slot = slot_advantages(judged)
        completion_ids = output["completion_ids"]
        rows, width = completion_ids.shape
        expected = [
            r.completion_ids if r is not None else None for rs in judged.rollouts for r in rs
        ]
        scored = completion_ids.tolist()
        if len(per_slot) != rows or any(
            ids is not None and scored[b][: len(ids)] != ids for b, ids in enumerate(expected)
        ):
            raise TrainerError(
                f"the batch TRL scored ({rows} completions) is not the rollout function's "
                f"last ({len(per_slot)} slots): per-turn advantages cannot be aligned"
            )
        previous = output["advantages"]
        advantages = torch.zeros((rows, width), dtype=previous.dtype, device=previous.device)
        for b, values in enumerate(per_slot):
            advantages[b, : len(values)] = torch.tensor(values, dtype=previous.dtype)
        output["advantages"] = advantages
        local = torch.tensor(
            slot_start_advantages(judged), dtype=torch.float64, device=previous.device
        )
        starts = self.accelerator.gather(local).tolist()  # TRL logs every process's
        logged = self._logs["advantages"]
        for _ in range(min(len(starts), len(logged))):
            logged.pop()  # TRL's episode-level advantages of this batch
        logged.extend(starts)
        return output
