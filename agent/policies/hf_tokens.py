"""Token-exact prompts for multi-turn episodes: each turn's prompt ids extend the last turn's.

Re-tokenizing what a model sampled is the multi-turn RL bug users report most (verl#3720,
SkyRL#123): the text `decode(ids)` often encodes back to other ids (a merge the model did
not make, a byte sequence that is not UTF-8), so a trainer that rebuilds the episode from
its text optimises tokens the model never produced. The `hf:` policy therefore never
encodes an answer. Turn k+1's prompt ids are

    prompt_ids[k] + completion_ids[k] + encode(tail)

where `tail` is the text the chat template puts after the previous answer: its end-of-turn
marker, the observation (or user) turn and the next generation prompt. The tail is found
by rendering the template three times over the history the loop sends:

- `before`:  the messages before the previous answer, with the generation prompt (what
  turn k's prompt was rendered from);
- `through`: the same messages and the previous answer, without a generation prompt;
- `full`:    every message, with the generation prompt (turn k+1's full render).

When `through == before + answer + eot` and `full == through + rest`, the tail is
`eot + rest`; an end-of-sequence token that the model sampled and the template also
writes at the start of `eot` is not added twice. The tail starts at a special token in
every chat template that closes a turn with one, so encoding it apart from the ids before
it cuts no merge that a whole render would make.

When the property cannot hold the turn is a full render, encoded whole, and the reason is
returned (`PromptIds.fallback`): the previous turn recorded no ids, the history's answer
is not the decoded completion (the loop cut it at its output cap), the template does not
write an answer verbatim after its prompt, or it renders earlier turns differently once
later ones follow (templates that drop an earlier turn's reasoning).

`episode_tokens` reads a finished episode's steps back as what a trainer optimises: the
first prompt, then one completion stream of sampled answers and the tails between them,
with a mask that is 1 on sampled tokens only (TRL's `env_mask`) and the sampled logprobs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent.errors import TokenStreamError
from agent.trajectory import Step

__all__ = ["ChatTokens", "EpisodeTokens", "PromptIds", "episode_tokens"]


@dataclass(frozen=True)
class PromptIds:
    """The prompt ids of one turn and how they were made."""

    ids: list[int]
    """The token ids the model is given."""
    extended: bool
    """True when `ids` are the previous turn's prompt and completion ids and the encoded tail."""
    fallback: str | None = None
    """Why a turn after the first is a full render instead; None on a first turn or when
    `extended`."""


class ChatTokens:
    """Renders a chat history with a tokenizer's chat template and builds prompt ids that
    extend the previous turn's (see the module docstring).

    `tokenizer` is a transformers tokenizer; without a chat template the rendering is
    plain `role: content` lines ending in `assistant: `.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.templated = bool(getattr(tokenizer, "chat_template", None))

    def render(self, messages: Sequence[dict[str, Any]], *, generation_prompt: bool) -> str:
        """The history as the model reads it; with `generation_prompt`, ending where the
        assistant's answer starts."""
        plain = [{"role": m["role"], "content": m.get("content") or ""} for m in messages]
        if self.templated:
            text = self.tokenizer.apply_chat_template(
                plain, tokenize=False, add_generation_prompt=generation_prompt
            )
            return str(text)
        lines = [f"{m['role']}: {m['content']}" for m in plain]
        return "\n".join([*lines, "assistant: "] if generation_prompt else lines)

    def encode(self, text: str) -> list[int]:
        """`text`'s ids, special-token markup read as special tokens, nothing added."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_ids(self, messages: Sequence[dict[str, Any]], steps: Sequence[Step]) -> PromptIds:
        """The prompt ids of the turn after `steps` for the history `messages`."""
        full = self.render(messages, generation_prompt=True)
        if not steps:
            return PromptIds(self.encode(full), extended=False)
        reason = self._tail_or_reason(messages, steps[-1], len(steps), full)
        if isinstance(reason, str):
            return PromptIds(self.encode(full), extended=False, fallback=reason)
        previous = steps[-1]
        assert previous.prompt_token_ids is not None and previous.completion_token_ids is not None
        return PromptIds(
            [*previous.prompt_token_ids, *previous.completion_token_ids, *reason],
            extended=True,
        )

    def _tail_or_reason(
        self, messages: Sequence[dict[str, Any]], previous: Step, turns: int, full: str
    ) -> list[int] | str:
        """The tail's ids, or why the previous turn cannot be extended."""
        if previous.prompt_token_ids is None or previous.completion_token_ids is None:
            return "the previous turn recorded no token ids"
        answers = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
        if len(answers) != turns:
            return f"the history holds {len(answers)} answers for {turns} recorded turns"
        at = answers[-1]
        content = messages[at].get("content") or ""
        sampled = self.tokenizer.decode(previous.completion_token_ids, skip_special_tokens=True)
        if previous.raw_output_truncated or content != sampled:
            return "the previous answer in the history is not its decoded completion"
        before = self.render(messages[:at], generation_prompt=True)
        through = self.render(messages[: at + 1], generation_prompt=False)
        if not through.startswith(before + content):
            return "the chat template does not write the answer verbatim after its prompt"
        if not full.startswith(through):
            return "the chat template renders an earlier turn differently once later turns follow"
        tail = through[len(before) + len(content) :] + full[len(through) :]
        eos = getattr(self.tokenizer, "eos_token", None)
        eos_id = getattr(self.tokenizer, "eos_token_id", None)
        ended = bool(previous.completion_token_ids) and previous.completion_token_ids[-1] == eos_id
        if ended and isinstance(eos, str) and eos and tail.startswith(eos):
            tail = tail[len(eos) :]
        return self.encode(tail)


@dataclass(frozen=True)
class EpisodeTokens:
    """An episode as one token stream: the first prompt, then everything after it."""

    prompt_ids: list[int]
    """The first turn's prompt ids (system prompt and task)."""
    completion_ids: list[int]
    """Every token after the first prompt, in order: each sampled answer, and between two
    answers the tail the template and the loop put there (end of turn, observation,
    generation prompt)."""
    sampled_mask: list[int]
    """1 where the model sampled the token, 0 on tails (keeps observations out of a loss)."""
    logprobs: list[float]
    """The sampled tokens' logprobs as recorded; 0.0 on tails."""


def episode_tokens(steps: Sequence[Step]) -> EpisodeTokens:
    """The episode's steps as one stream (`EpisodeTokens`), from their recorded ids.

    Raises:
        TokenStreamError: there is no step, a step recorded no ids or logprobs (or they
            do not align), or a prompt does not extend the previous prompt and answer
            (the policy fell back to a full render: `PolicyResponse.token_prefix_break`).
    """
    if not steps:
        raise TokenStreamError("an episode without steps has no token stream")
    stream: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    first: list[int] | None = None
    for step in steps:
        prompt, answer, values = step.prompt_token_ids, step.completion_token_ids, step.logprobs
        if prompt is None or answer is None or values is None or len(values) != len(answer):
            raise TokenStreamError(
                f"step {step.index} recorded no aligned prompt ids, completion ids and logprobs"
            )
        if first is None:
            first = list(prompt)
        else:
            done = len(first) + len(stream)
            if prompt[: len(first)] != first or prompt[len(first) : done] != stream:
                raise TokenStreamError(
                    f"step {step.index}'s prompt does not extend the previous prompt and answer"
                )
            tail = prompt[done:]
            stream += tail
            mask += [0] * len(tail)
            logprobs += [0.0] * len(tail)
        stream += answer
        mask += [1] * len(answer)
        logprobs += values
    assert first is not None
    return EpisodeTokens(first, stream, mask, logprobs)
