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

Batching: one generation runs at a time, in a worker thread so the event loop stays live.
Requests that arrive while it runs wait and form the next batch, left-padded, when
`HFGeneration.max_batch_size` allows more than one (the default is 1: greedy runs stay
reproducible); `batch_window_s` holds a batch open up to that long for more requests
first, and no longer once `max_batch_size` are waiting. A
request alone is generated exactly as before batching existed: no padding, the same
generation config. Rows of a batch get the same token budget as alone (the model's
positions left after their prompt, at most `settings.max_tokens`); a request that would
push a longer batch past the model's positions waits for the next batch.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agent.errors import PolicyError, PolicyLoadError
from agent.policies.base import Policy, PolicyRequest, PolicyResponse
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
    """Seed of the sampling: each batch draws from a generator seeded by it and the batch's
    (episode seed, step) pairs, so a rollout repeats when its batch does; the process's
    torch generator is left as it was. None: draw from the process's generator."""
    max_batch_size: int = Field(default=1, ge=1)
    """Most requests generated in one batch. 1 by default: a left-padded batch is not
    bit-identical to generating each row alone, and which requests share a batch depends
    on timing, so a greedy evaluation batched could flip a close argmax between runs.
    RL rollouts, sampled anyway, batch the group (e.g. 8)."""
    batch_window_s: float = Field(default=0.0, ge=0)
    """How long a batch stays open for more requests before it runs, at most: it runs as
    soon as `max_batch_size` requests wait (0: whatever is waiting when the previous
    generation ends). Concurrent episodes fall out of step (each waits for its tools
    between turns), so without a window a batch holds whoever happened to be waiting."""


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
    """Generate calls."""
    largest_batch: int = 0
    """Most requests in one generate call."""


@dataclass
class _Job:
    request: PolicyRequest
    future: concurrent.futures.Future[PolicyResponse] = field(
        default_factory=concurrent.futures.Future
    )
    prompt: PromptIds | None = None
    budget: int = 0
    started: bool = False
    """Taken by the worker (its future is running): a job deferred to the next batch."""


class _SampledLogprobs:
    """A logits processor that keeps, per row, the logprob of each token the model picks.

    Called once per generated position with the scores before temperature and top-p; the
    token picked from them is only known at the next call (or from the output), so the
    log-softmax of one position is kept until then.
    """

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature
        self.picked: list[Any] = []
        self._pending: Any = None

    def _take(self, tokens: Any) -> None:
        if self._pending is not None:
            self.picked.append(self._pending.gather(1, tokens[:, None]).squeeze(1))
            self._pending = None

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        self._take(input_ids[:, -1])
        self._pending = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, last_tokens: Any) -> list[list[float]]:
        """Per row, the logprob of every generated position."""
        import torch

        self._take(last_tokens)
        if not self.picked:
            return []
        rows: list[list[float]] = torch.stack(self.picked, dim=1).tolist()
        return rows


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
        # Cancelling this await (the loop's policy timeout) cancels the job if it has
        # not started; a started one finishes with its batch and its answer is dropped.
        response = await asyncio.wrap_future(job.future)
        return response.model_copy(update={"latency_ms": (time.perf_counter() - started) * 1000.0})

    def _drain(self) -> None:
        """Worker thread: run batches until no request waits, then end."""
        size = self.generation.max_batch_size
        while True:
            with self._jobs_waiting:
                if self.generation.batch_window_s and self._jobs:  # a batch to hold open
                    closes = time.monotonic() + self.generation.batch_window_s
                    while len(self._jobs) < size and (left := closes - time.monotonic()) > 0:
                        self._jobs_waiting.wait(left)
                taken = self._jobs[:size]
                del self._jobs[: len(taken)]
                if not taken:
                    self._worker = None
                    return
            ready = [j for j in taken if j.started or j.future.set_running_or_notify_cancel()]
            for job in ready:
                job.started = True
            try:
                deferred = self._run(ready)
            except Exception as e:
                # Not a policy failure (those are set per job in `_run`): a programming
                # error, handed to every caller of the batch as it is; the next batch runs.
                for job in ready:
                    if not job.future.done():
                        job.future.set_exception(e)
                continue
            if deferred:
                with self._jobs_lock:
                    self._jobs[:0] = deferred

    def _run(self, jobs: list[_Job]) -> list[_Job]:
        """Prepare and generate `jobs`; returns those left for the next batch (still running)."""
        if not jobs:
            return []
        try:
            self._load()
        except PolicyError as e:
            for job in jobs:
                job.future.set_exception(e)
            return []
        batch: list[_Job] = []
        for job in jobs:
            try:
                self._prepare(job)
            except PolicyError as e:
                job.future.set_exception(e)
            else:
                batch.append(job)
        batch, deferred = self._fit(batch)
        if batch:
            try:
                answers = self._generate(batch)
            except PolicyError as e:
                for job in batch:
                    job.future.set_exception(e)
            else:
                for job, answer in zip(batch, answers, strict=True):
                    job.future.set_result(answer)
        return deferred

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

    def _fit(self, jobs: list[_Job]) -> tuple[list[_Job], list[_Job]]:
        """The jobs that can share one generate call, and those that wait: a batch runs
        as many steps as its largest budget, which must fit after every row's prompt."""
        limit = self._context_limit()
        batch: list[_Job] = []
        deferred: list[_Job] = []
        steps = 0
        for job in jobs:
            assert job.prompt is not None
            candidate = [*batch, job]
            need = max(steps, job.budget)
            if limit is None or all(
                len(j.prompt.ids) + need <= limit for j in candidate if j.prompt
            ):
                batch, steps = candidate, need
            else:
                deferred.append(job)
        return batch, deferred

    def _seed(self, jobs: Sequence[_Job]) -> int:
        rows = ",".join(f"{j.request.seed}:{j.request.step_index}" for j in jobs)
        digest = hashlib.sha256(f"{self.generation.seed}|{rows}".encode()).digest()
        return int.from_bytes(digest[:8], "big") & 0x7FFF_FFFF_FFFF_FFFF

    def _generate(self, jobs: Sequence[_Job]) -> list[PolicyResponse]:
        import torch

        tokenizer, model, options = self._tokenizer, self._model, self.generation
        eos = tokenizer.eos_token_id
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
        prompts = [list(j.prompt.ids) if j.prompt else [] for j in jobs]
        width = max(len(p) for p in prompts)
        input_ids = torch.tensor(
            [[pad] * (width - len(p)) + p for p in prompts], dtype=torch.long, device=model.device
        )
        attention = torch.tensor(
            [[0] * (width - len(p)) + [1] * len(p) for p in prompts],
            dtype=torch.long,
            device=model.device,
        )
        sampling: dict[str, Any] = (
            {"temperature": options.temperature, "top_p": options.top_p, "top_k": 0}
            if options.do_sample
            else {}
        )
        config = _transformers().GenerationConfig(
            do_sample=options.do_sample,
            max_new_tokens=max(j.budget for j in jobs),
            eos_token_id=eos,
            pad_token_id=pad,
            **sampling,
        )
        recorder = _SampledLogprobs(options.temperature if options.do_sample else 1.0)
        processors = _transformers().LogitsProcessorList([recorder])
        training = bool(getattr(model, "training", False))
        cuda = [model.device] if model.device.type == "cuda" else []
        try:
            if training:
                model.eval()
            with torch.inference_mode(), torch.random.fork_rng(devices=cuda):
                if options.do_sample and options.seed is not None:
                    torch.manual_seed(self._seed(jobs))
                output = model.generate(
                    input_ids=input_ids,
                    attention_mask=attention,
                    generation_config=config,
                    logits_processor=processors,
                )
        except (RuntimeError, ValueError, IndexError) as e:
            raise PolicyError(f"generation with {self.path} failed: {e}") from e
        finally:
            if training:
                model.train()
        logprobs = recorder.finish(output[:, -1])
        new = output[:, width:].tolist()
        self._stats.batches += 1
        self._stats.largest_batch = max(self._stats.largest_batch, len(jobs))
        return [
            self._answer(job, row, logprobs[i] if logprobs else [], eos)
            for i, (job, row) in enumerate(zip(jobs, new, strict=True))
        ]

    def _answer(
        self, job: _Job, row: list[int], logprobs: list[float], eos: int | None
    ) -> PolicyResponse:
        cut = row[: job.budget]
        if eos is not None and eos in cut:
            cut = cut[: cut.index(eos) + 1]
        assert job.prompt is not None
        self._stats.answers += 1
        text = self._tokenizer.decode(cut, skip_special_tokens=True)
        return PolicyResponse(
            text=str(text),
            prompt_tokens=len(job.prompt.ids),
            completion_tokens=len(cut),
            finish_reason="stop" if cut and cut[-1] == eos else "length",
            model=str(self.path),
            prompt_token_ids=list(job.prompt.ids),
            completion_token_ids=cut,
            logprobs=[float(x) for x in logprobs[: len(cut)]],
            token_prefix_break=job.prompt.fallback,
        )

    async def aclose(self) -> None:
        worker = self._worker
        if worker is not None:
            await asyncio.to_thread(worker.join)
        if self._owns_model:
            self._model = None
            self._tokenizer = None
            self._chat = None
