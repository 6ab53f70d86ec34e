"""A test double of the trainer's in-memory model as the policy of GRPO rollouts, whose
answers a test can force (`sample` is overridable) while it records what it sampled.

Production rollouts use `agent.policies.hf.HFPolicy.from_loaded` (batched, token-exact
by the same prefix rule); this double exists because a test needs some rollouts' answers
fixed to know the groups' rewards, which the real policy has no hook for. It keeps a
ledger of every turn's prompt ids, sampled ids and
logprobs, keyed by (task, policy seed, step index), and `record_tokens` writes them onto
a finished trajectory's steps (the rollout source calls it before the episode is stored).

Prompts extend by construction: turn 0 is the chat template of the system prompt and the
task; turn k+1 is turn k's prompt ids, the ids turn k sampled, then the tokens of what the
loop appended after the answer (the template's end of turn, the observation as a user
turn, the next assistant header), rendered as text and tokenized on their own. The
sampled ids are never decoded and re-encoded. Generation samples at `temperature`
(`do_sample`), at most `max_new_tokens` a turn, one request at a time (the model is
shared with the optimiser, in the trainer's process); logprobs are those of the sampling
distribution (the logits after the temperature), as TRL computes its own.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from agent.errors import PolicyError
from agent.policies.base import Policy, PolicyRequest, PolicyResponse
from agent.prompt import PromptStyle, render_system_prompt
from agent.trajectory import Trajectory
from sandbox.tool_specs import ToolSpec

__all__ = ["TrainerModelPolicy"]


@dataclass(frozen=True)
class _Turn:
    messages: int
    """Messages in the request (the history the turn answered)."""
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    text: str


class TrainerModelPolicy(Policy):
    """Sample from `model` (the trainer's, being optimised) with `tokenizer`'s chat template."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        spec: str,
        prompt_style: PromptStyle = PromptStyle.FULL,
        temperature: float = 1.0,
        max_new_tokens: int = 256,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.spec = spec
        self.prompt_style = prompt_style
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self._lock = threading.Lock()
        self._turns: dict[tuple[str, int, int], _Turn] = {}

    def system_prompt(self, tools: Iterable[ToolSpec]) -> str:
        return render_system_prompt(tools, self.prompt_style)

    # ------------------------------------------------------------------ rendering

    def _render(self, messages: list[dict[str, Any]], *, generation: bool) -> str:
        plain = [{"role": m["role"], "content": m.get("content") or ""} for m in messages]
        return str(
            self.tokenizer.apply_chat_template(
                plain, tokenize=False, add_generation_prompt=generation
            )
        )

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _prompt_ids(self, request: PolicyRequest) -> list[int]:
        messages = request.messages
        if request.step_index == 0:
            return self._encode(self._render(messages, generation=True))
        previous = self._turns.get((request.task.task_id, request.seed, request.step_index - 1))
        if previous is None:
            raise PolicyError(
                f"no recorded turn {request.step_index - 1} of {request.task.task_id} (seed "
                f"{request.seed}): this policy only continues episodes it started"
            )
        answered = messages[: previous.messages + 1]  # the history and the recorded answer
        before = self._render(answered, generation=False)
        after = self._render(messages, generation=True)
        if not after.startswith(before):
            raise PolicyError("the chat template renders a longer history as another prefix")
        content = str(answered[-1].get("content") or "")
        cut = before.rfind(content) + len(content) if content else len(before)
        tail = before[cut:]  # the template's end of the assistant turn
        eos = self.tokenizer.eos_token
        if previous.completion_ids[-1:] == [self.tokenizer.eos_token_id] and tail.startswith(eos):
            tail = tail[len(eos) :]  # sampled already
        return [
            *previous.prompt_ids,
            *previous.completion_ids,
            *self._encode(tail + after[len(before) :]),
        ]

    # ----------------------------------------------------------------- generation

    def sample(
        self, prompt_ids: list[int], request: PolicyRequest
    ) -> tuple[list[int], list[float]]:
        """The ids the model samples after `prompt_ids`, with their logprobs.

        Raises:
            PolicyError: generation failed (a history longer than the model's positions).
        """
        import torch

        model = self.model
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                out = model.generate(
                    input_ids=torch.tensor([prompt_ids], device=model.device),
                    attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                    do_sample=True,
                    temperature=self.temperature,
                    top_k=0,
                    top_p=1.0,
                    max_new_tokens=self.max_new_tokens,
                    eos_token_id=self.tokenizer.eos_token_id,
                    pad_token_id=self.tokenizer.pad_token_id,
                    output_scores=True,
                    return_dict_in_generate=True,
                )
        except (RuntimeError, ValueError, IndexError) as e:
            raise PolicyError(f"generation with the trainer's model failed: {e}") from e
        finally:
            model.train(was_training)
        sampled = [int(t) for t in out.sequences[0, len(prompt_ids) :]]
        logprobs = [
            float(torch.log_softmax(score[0].float(), dim=-1)[token])
            for score, token in zip(out.scores, sampled, strict=True)
        ]
        return sampled, logprobs

    def _generate(self, request: PolicyRequest) -> _Turn:
        with self._lock:
            prompt_ids = self._prompt_ids(request)
            sampled, logprobs = self.sample(prompt_ids, request)
            turn = _Turn(
                messages=len(request.messages),
                prompt_ids=prompt_ids,
                completion_ids=sampled,
                logprobs=logprobs,
                text=str(self.tokenizer.decode(sampled, skip_special_tokens=True)),
            )
            self._turns[(request.task.task_id, request.seed, request.step_index)] = turn
            return turn

    async def respond(self, request: PolicyRequest) -> PolicyResponse:
        turn = await asyncio.to_thread(self._generate, request)
        return PolicyResponse(
            text=turn.text,
            prompt_tokens=len(turn.prompt_ids),
            completion_tokens=len(turn.completion_ids),
            finish_reason="stop"
            if turn.completion_ids[-1:] == [self.tokenizer.eos_token_id]
            else "length",
        )

    def record_tokens(self, trajectory: Trajectory) -> None:
        """Write each step's recorded prompt ids, sampled ids and logprobs onto
        `trajectory` (and forget them)."""
        for step in trajectory.steps:
            turn = self._turns.pop((trajectory.task_id, trajectory.policy_seed, step.index), None)
            if turn is not None:
                step.prompt_token_ids = turn.prompt_ids
                step.completion_token_ids = turn.completion_ids
                step.logprobs = turn.logprobs
