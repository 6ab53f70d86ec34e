"""`hf:` policy: a transformers model in this process, greedy or sampled, batched across
the episodes that run at once, recording the token ids and logprobs it sampled.

Two ways to build one:

- `HFPolicy(path, settings)` (`hf:<dir>` specs): the checkpoint at `path` loads lazily on
  the first request with `local_files_only=True`, no hub access ever. The system prompt
  is the style the checkpoint was trained with: `prompt_style` of the
  `training_config.json` epiflow writes into every checkpoint directory (`compact` for the
  small local models, see `agent.prompt`); `full` when the file or the key is absent.
- `HFPolicy.from_loaded(model, tokenizer, settings, spec=…, prompt_style=…)`: a model and
  tokenizer already in memory, the trainer's own during RL rollouts. The policy never
  frees or moves them, and puts the model in eval mode only while it generates.

Token in, token out: every answer records the prompt ids the model was given, the ids it
sampled (its end-of-turn token included when it sampled one) and each sampled token's
logprob. Turn k+1's prompt ids are turn k's prompt and completion ids plus the encoded
text the chat template puts after the answer, never a re-encoding of the sampled text
(`agent.policies.hf_tokens`); a turn where that cannot hold is a full render, logged once
per reason, counted in `token_stats` and named on the response (`token_prefix_break`).

The logprob of a sampled token is taken from the model's scores divided by the sampling
temperature (1 when greedy), before top-p cuts the distribution: the quantity TRL's
`GRPOTrainer` computes from its logits, so old and new logprobs compare.

Batching: one worker thread decodes, so the event loop stays live. With
`HFGeneration.max_batch_size` above 1 (the default is 1: greedy runs stay reproducible) the
requests decode together and continuously (`agent.policies.hf_decode`): a waiting request
joins the running batch at the next step, and a row leaves it, answered, the step it ends,
so a turn neither waits for a whole batch to finish nor idles behind the batch's longest
row. `batch_window_s` holds an idle policy for more requests first, and no longer once
`max_batch_size` are waiting. Each row has its own positions and mask, so a request alone
is decoded as in a batch, only without padding; its budget is the model's positions left
after its own prompt, at most `settings.max_tokens`. An answered turn's KV cache is kept
(the newest `max_batch_size` of them) and the episode's next turn, whose prompt ids extend
it, prefills only its tail (`HFTokenStats.cached_prompt_tokens`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agent.errors import PolicyError, PolicyLoadError
from agent.policies.base import Policy, PolicyRequest, PolicyResponse
from agent.policies.hf_decode import DecodeBatch, Row, Sampling
from agent.policies.hf_tokens import ChatTokens, PromptIds
from agent.prompt import PromptStyle, render_system_prompt
from agent.settings import PolicySettings
from sandbox.tool_specs import ToolSpec

__all__ = [
    "TRAINING_CONFIG_FILE",
    "HFGeneration",
    "HFPolicy",
    "HFTokenStats",
    "checkpoint_prompt_style",
]

logger = logging.getLogger(__name__)

TRAINING_CONFIG_FILE = "training_config.json"
"""The training config epiflow writes into every checkpoint directory."""


def checkpoint_prompt_style(path: Path) -> PromptStyle:
    """The prompt style the checkpoint at `path` was trained with (`full` when unrecorded).

    Raises:
        PolicyLoadError: the recorded config is unreadable or names an unknown style.
    """
    config = path / TRAINING_CONFIG_FILE
    if not config.is_file():
        return PromptStyle.FULL
    try:
        recorded = json.loads(config.read_text(encoding="utf-8")).get("prompt_style")
        return PromptStyle(recorded or PromptStyle.FULL)
    except (OSError, ValueError, AttributeError) as e:
        raise PolicyLoadError(f"{config}: cannot read the recorded prompt style: {e}") from e


def _transformers() -> Any:
    """The transformers module, imported on first use (it takes seconds) and typed loosely."""
    import transformers

    return transformers


class HFGeneration(BaseModel):
    """How the `hf:` policy decodes and batches (the default: greedy, no window)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    do_sample: bool = False
    """Sample instead of greedy decoding (RL rollouts sample)."""
    temperature: float = Field(default=1.0, gt=0)
    """Sampling temperature; logprobs are of the scores divided by it. Ignored when greedy."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus sampling mass (1: the whole distribution). Ignored when greedy."""
    seed: int | None = None
    """Seed of the sampling: each request draws from its own generator, seeded by it and
    the request's (episode seed, step), so a rollout repeats whoever shares its batch (up
    to floating-point noise in the scores); the process's torch generator is left as it
    was. None: draw from the process's generator."""
    max_batch_size: int = Field(default=1, ge=1)
    """Most rows decoding at once. 1 by default: a padded batch is not bit-identical to
    decoding each row alone, and which requests share a batch depends on timing, so a
    greedy evaluation batched could flip a close argmax between runs. RL rollouts,
    sampled anyway, decode the concurrent episodes' turns together (e.g. 16)."""
    batch_window_s: float = Field(default=0.0, ge=0)
    """How long an idle policy waits, at most, for more requests before it starts
    decoding: it starts as soon as `max_batch_size` requests wait (0: at once). Requests
    that arrive while rows decode join at the next step, without a window."""


@dataclass
class HFTokenStats:
    """What the policy generated and how its prompts were made (read by trainers and tests)."""

    answers: int = 0
    """Answers generated."""
    extended_prompts: int = 0
    """Turns whose prompt ids extend the previous turn's prompt and completion ids."""
    full_renders: int = 0
    """Turns after an episode's first whose prompt had to be rendered and encoded whole."""
    batches: int = 0
    """Prefill forwards: one over the requests that joined the decoding batch together,
    and one for each that joined with a kept cache (`cached_prompt_tokens`)."""
    largest_batch: int = 0
    """Most rows decoding at once."""
    decode_steps: int = 0
    """Decode forwards of closed batches (a batch closes when its last row ends)."""
    row_steps: int = 0
    """Rows summed over those forwards: `row_steps / decode_steps` rows a step."""
    cached_prompt_tokens: int = 0
    """Prompt tokens not prefilled: an earlier turn of the episode left their KV cache."""


@dataclass
class _Job:
    request: PolicyRequest
    future: concurrent.futures.Future[PolicyResponse] = field(
        default_factory=concurrent.futures.Future
    )
    prompt: PromptIds | None = None
    budget: int = 0
    abandoned: bool = False
    """Its caller stopped waiting (cancelled): the row leaves the batch at the next step."""


class HFPolicy(Policy):
    """Generation from a transformers model, at most `settings.max_tokens` new tokens."""

    def __init__(
        self,
        path: str | Path,
        settings: PolicySettings,
        *,
        spec: str | None = None,
        generation: HFGeneration | None = None,
    ) -> None:
        self.path = Path(path)
        self.settings = settings
        self.spec = spec or f"hf:{self.path}"
        self.generation = generation or HFGeneration()
        self._model: Any = None
        self._tokenizer: Any = None
        self._chat: ChatTokens | None = None
        self._owns_model = True
        self._prompt_style: PromptStyle | None = None
        self._jobs: list[_Job] = []
        self._jobs_lock = threading.Lock()
        self._jobs_waiting = threading.Condition(self._jobs_lock)
        self._worker: threading.Thread | None = None
        self._stats = HFTokenStats()
        self._warned: set[str] = set()
        self._was_training = False
        self._kept: OrderedDict[tuple[int, ...], Any] = OrderedDict()
        """KV caches of answered turns, by their prompt and answer ids (`_keep`)."""

    @classmethod
    def from_loaded(
        cls,
        model: Any,
        tokenizer: Any,
        settings: PolicySettings,
        *,
        spec: str,
        prompt_style: PromptStyle = PromptStyle.FULL,
        generation: HFGeneration | None = None,
    ) -> HFPolicy:
        """A policy over a model and tokenizer already loaded (the trainer's, during RL).

        `spec` is what trajectories record as their policy (e.g. `hf:<run>@step-12`);
        `prompt_style` the system prompt the model was trained on. The caller keeps
        owning the model: `aclose` leaves it alone, and it is not moved.
        """
        policy = cls(
            str(getattr(model, "name_or_path", "") or spec),
            settings,
            spec=spec,
            generation=generation,
        )
        policy._model, policy._tokenizer = model, tokenizer
        policy._owns_model = False
        policy._prompt_style = PromptStyle(prompt_style)
        return policy

    @property
    def prompt_style(self) -> PromptStyle:
        """The system prompt style this checkpoint was trained with."""
        if self._prompt_style is None:
            self._prompt_style = checkpoint_prompt_style(self.path)
        return self._prompt_style

    @property
    def token_stats(self) -> HFTokenStats:
        """A copy of the counts so far (answers, extended prompts, full renders, batches)."""
        return replace(self._stats)

    def system_prompt(self, tools: Iterable[ToolSpec]) -> str:
        return render_system_prompt(tools, self.prompt_style)

    def _load(self) -> None:
        if self._model is None:
            if not self.path.is_dir():
                raise PolicyLoadError(f"hf checkpoint {self.path} is not a directory")
            try:
                tf = _transformers()
                tokenizer = tf.AutoTokenizer.from_pretrained(str(self.path), local_files_only=True)
                model = tf.AutoModelForCausalLM.from_pretrained(
                    str(self.path), local_files_only=True
                )
            except (OSError, ValueError, KeyError, RuntimeError) as e:
                raise PolicyLoadError(f"cannot load hf checkpoint {self.path}: {e}") from e
            try:
                model = model.to(self.settings.hf_device)
            except (RuntimeError, ValueError) as e:
                raise PolicyLoadError(
                    f"cannot move {self.path} to device {self.settings.hf_device!r}: {e}"
                ) from e
            model.eval()
            self._tokenizer, self._model = tokenizer, model
        if self._chat is None:
            self._chat = ChatTokens(self._tokenizer)

    async def respond(self, request: PolicyRequest) -> PolicyResponse:
        started = time.perf_counter()
        job = _Job(request)
        with self._jobs_lock:
            self._jobs.append(job)
            self._jobs_waiting.notify()
            start = self._worker is None
            if start:
                self._worker = threading.Thread(
                    target=self._drain, name=f"hf-policy {self.spec}", daemon=True
                )
        if start:
            assert self._worker is not None
            self._worker.start()
        # Cancelling this await (the loop's policy timeout, a stop) cancels the job if it
        # has not started; a started one leaves the decoding batch at its next step.
        try:
            response = await asyncio.wrap_future(job.future)
        except asyncio.CancelledError:
            job.abandoned = True
            raise
        return response.model_copy(update={"latency_ms": (time.perf_counter() - started) * 1000.0})

    def _drain(self) -> None:
        """Worker thread: decode until no row is live and no request waits, then end.

        Waiting requests join the decoding batch before each step (`hf_decode`), up to
        `max_batch_size` rows; the window holds an idle batch open for more of them.
        """
        size = self.generation.max_batch_size
        batch: DecodeBatch | None = None
        while True:
            with self._jobs_waiting:
                live = len(batch) if batch is not None else 0
                if self.generation.batch_window_s and self._jobs and not live:
                    closes = time.monotonic() + self.generation.batch_window_s
                    while len(self._jobs) < size and (left := closes - time.monotonic()) > 0:
                        self._jobs_waiting.wait(left)
                room = size - live if batch is None or batch.can_join else 0
                taken = self._jobs[:room]
                del self._jobs[: len(taken)]
                if not taken and not live:
                    self._worker = None
                    return
            ready = [j for j in taken if j.future.set_running_or_notify_cancel()]
            try:
                batch = self._advance(batch, ready)
            except Exception as e:
                # Not a policy failure (those are set per job in `_advance`): a
                # programming error, handed to every caller of the batch as it is.
                live_jobs = [r.key for r in batch.rows] if batch is not None else []
                for job in [*ready, *live_jobs]:
                    if not job.future.done():
                        job.future.set_exception(e)
                self._close_batch(batch)
                batch = None

    def _advance(self, batch: DecodeBatch | None, jobs: list[_Job]) -> DecodeBatch | None:
        """Let `jobs` join the batch, then run one decode step; answer the rows that end.
        Returns the batch, or None once no row is left in it."""
        if jobs:
            try:
                self._load()
            except PolicyError as e:
                for job in jobs:
                    job.future.set_exception(e)
                jobs = []
        rows: list[Row] = []
        for job in jobs:
            try:
                self._prepare(job)
            except PolicyError as e:
                job.future.set_exception(e)
            else:
                assert job.prompt is not None
                row = Row(job, list(job.prompt.ids), job.budget, generator=self._generator(job))
                rows.append(self._with_prefix(row))
        if batch is None:
            if not rows:
                return None
            batch = self._open_batch()
        for row in batch.rows:
            if row.key.abandoned:
                row.done = row.dropped = True
        batch.finished()  # abandoned rows: nobody waits for their answer
        prefills = batch.prefills
        try:
            ended = batch.admit(rows)
            self._stats.batches += batch.prefills - prefills
            self._stats.largest_batch = max(self._stats.largest_batch, len(batch) + len(ended))
            ended += batch.step()
        except (RuntimeError, ValueError, IndexError) as e:
            error = PolicyError(f"generation with {self.path} failed: {e}")
            for job in [*(r.key for r in rows), *(r.key for r in batch.rows)]:
                if not job.future.done():
                    job.future.set_exception(error)
            self._close_batch(batch)
            return None
        eos = self._tokenizer.eos_token_id
        for row in ended:
            row.key.future.set_result(self._answer(row.key, row.tokens, row.logprobs, eos))
            self._keep(row)
        if len(batch):
            return batch
        self._close_batch(batch)
        return None

    def _with_prefix(self, row: Row) -> Row:
        """`row` with the KV cache of an earlier turn whose ids start its prompt (the
        longest kept), taken out of the store: only the rest of the prompt is prefilled."""
        best: tuple[int, ...] | None = None
        for ids in self._kept:
            longer = best is None or len(ids) > len(best)
            if longer and len(ids) <= len(row.prompt) and tuple(row.prompt[: len(ids)]) == ids:
                best = ids
        if best is not None:
            row.prefix, row.prefix_len = self._kept.pop(best), len(best) - 1
            self._stats.cached_prompt_tokens += row.prefix_len
        return row

    def _keep(self, row: Row) -> None:
        """Keep an answered row's KV cache for its episode's next turn (whose prompt ids
        extend its prompt and answer: `hf_tokens`), the oldest dropped past
        `max_batch_size` kept."""
        if row.kv is None:
            return
        self._kept[tuple(row.prompt + row.tokens)] = row.kv
        row.kv = None
        while len(self._kept) > self.generation.max_batch_size:
            self._kept.popitem(last=False)

    def _open_batch(self) -> DecodeBatch:
        """An empty decoding batch over the model, put in eval mode until it closes."""
        tokenizer, model, options = self._tokenizer, self._model, self.generation
        eos = tokenizer.eos_token_id
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
        self._was_training = bool(getattr(model, "training", False))
        if self._was_training:
            model.eval()
        return DecodeBatch(
            model,
            eos=eos,
            pad=pad,
            sampling=Sampling(
                do_sample=options.do_sample, temperature=options.temperature, top_p=options.top_p
            ),
            keep_kv=True,
        )

    def _close_batch(self, batch: DecodeBatch | None) -> None:
        """Give the model back its training mode; fold the batch's counts into the stats."""
        if batch is None:
            return
        if self._was_training:
            self._model.train()
            self._was_training = False
        self._stats.decode_steps += batch.steps
        self._stats.row_steps += batch.row_steps

    def _context_limit(self) -> int | None:
        limit = getattr(self._model.config, "max_position_embeddings", None)
        return None if limit is None else int(limit)

    def _prepare(self, job: _Job) -> None:
        """The job's prompt ids and token budget."""
        if job.prompt is not None:
            return
        assert self._chat is not None
        prompt = self._chat.prompt_ids(job.request.messages, job.request.steps)
        if prompt.fallback is not None:
            self._stats.full_renders += 1
            if prompt.fallback not in self._warned:
                self._warned.add(prompt.fallback)
                logger.warning(
                    "%s: a turn's prompt ids do not extend the previous turn's (%s); "
                    "encoding the whole history instead (counted in token_stats.full_renders)",
                    self.spec,
                    prompt.fallback,
                )
        elif prompt.extended:
            self._stats.extended_prompts += 1
        # Never generate past the model's positions: the answer is cut to fit, and a
        # history that already fills the context is the policy's failure, not a crash.
        # Each row has its own positions in the batch, so only its own prompt counts.
        limit = self._context_limit()
        length = len(prompt.ids)
        budget = (
            self.settings.max_tokens
            if limit is None
            else min(self.settings.max_tokens, limit - length)
        )
        if budget <= 0:
            raise PolicyError(
                f"the conversation ({length} tokens) fills {self.path}'s context of {limit} tokens"
            )
        job.prompt, job.budget = prompt, budget

    def _generator(self, job: _Job) -> Any:
        """The row's own seeded generator (None: the process's), from the policy's seed and
        the request's (episode seed, step): a rollout's draws do not depend on its batch."""
        if not (self.generation.do_sample and self.generation.seed is not None):
            return None
        import torch

        key = f"{self.generation.seed}|{job.request.seed}:{job.request.step_index}"
        digest = hashlib.sha256(key.encode()).digest()
        generator = torch.Generator(device=self._model.device)
        generator.manual_seed(int.from_bytes(digest[:8], "big") & 0x7FFF_FFFF_FFFF_FFFF)
        return generator

    def _answer(
        self, job: _Job, tokens: list[int], logprobs: list[float], eos: int | None
    ) -> PolicyResponse:
        assert job.prompt is not None
        self._stats.answers += 1
        text = self._tokenizer.decode(tokens, skip_special_tokens=True)
        return PolicyResponse(
            text=str(text),
            prompt_tokens=len(job.prompt.ids),
            completion_tokens=len(tokens),
            finish_reason="stop" if tokens and tokens[-1] == eos else "length",
            model=str(self.path),
            prompt_token_ids=list(job.prompt.ids),
            completion_token_ids=list(tokens),
            logprobs=[float(x) for x in logprobs],
            token_prefix_break=job.prompt.fallback,
        )

    async def aclose(self) -> None:
        worker = self._worker
        if worker is not None:
            await asyncio.to_thread(worker.join)
        self._kept.clear()
        if self._owns_model:
            self._model = None
            self._tokenizer = None
            self._chat = None
