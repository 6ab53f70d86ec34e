"""`hf:` policy: a local transformers checkpoint directory, greedy decoding in a worker thread.

The model and tokenizer load lazily (first request) with `local_files_only=True`: no hub
access ever. The prompt is the tokenizer's chat template (or a plain `role: content`
rendering when the checkpoint has none). Generation is serialised per policy instance:
one model, one generation at a time, run via `asyncio.to_thread` so the loop stays live.

The system prompt is the style the checkpoint was trained with: `prompt_style` of the
`training_config.json` epiflow writes into every checkpoint directory (`compact` for the
small local models, see `agent.prompt`); `full` when the file or the key is absent (any
other HF model).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agent.errors import PolicyError, PolicyLoadError
from agent.policies.base import Policy, PolicyRequest, PolicyResponse
from agent.prompt import PromptStyle, render_system_prompt
from agent.settings import PolicySettings
from sandbox.tool_specs import ToolSpec

__all__ = ["TRAINING_CONFIG_FILE", "HFPolicy", "checkpoint_prompt_style"]

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


def _plain_prompt(messages: list[dict[str, Any]]) -> str:
    lines = [f"{m.get('role', 'user')}: {m.get('content') or ''}" for m in messages]
    return "\n".join([*lines, "assistant: "])


class HFPolicy(Policy):
    """Greedy generation from the checkpoint at `path`, at most `settings.max_tokens` new tokens."""

    def __init__(
        self, path: str | Path, settings: PolicySettings, *, spec: str | None = None
    ) -> None:
        self.path = Path(path)
        self.settings = settings
        self.spec = spec or f"hf:{self.path}"
        self._lock = threading.Lock()
        self._model: Any = None
        self._tokenizer: Any = None
        self._prompt_style: PromptStyle | None = None

    @property
    def prompt_style(self) -> PromptStyle:
        """The system prompt style this checkpoint was trained with."""
        if self._prompt_style is None:
            self._prompt_style = checkpoint_prompt_style(self.path)
        return self._prompt_style

    def system_prompt(self, tools: Iterable[ToolSpec]) -> str:
        return render_system_prompt(tools, self.prompt_style)

    def _load(self) -> None:
        if self._model is not None:
            return
        if not self.path.is_dir():
            raise PolicyLoadError(f"hf checkpoint {self.path} is not a directory")
        try:
            tf = _transformers()
            tokenizer = tf.AutoTokenizer.from_pretrained(str(self.path), local_files_only=True)
            model = tf.AutoModelForCausalLM.from_pretrained(str(self.path), local_files_only=True)
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

    def _generate(self, messages: list[dict[str, Any]]) -> tuple[str, int, int]:
        import torch

        with self._lock:
            self._load()
            tokenizer, model = self._tokenizer, self._model
            plain = [{"role": m["role"], "content": m.get("content") or ""} for m in messages]
            if getattr(tokenizer, "chat_template", None):
                prompt = tokenizer.apply_chat_template(
                    plain, tokenize=False, add_generation_prompt=True
                )
            else:
                prompt = _plain_prompt(plain)
            encoded = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).to(
                model.device
            )
            eos = tokenizer.eos_token_id
            pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
            prompt_len = int(encoded["input_ids"].shape[1])
            # Never generate past the model's positions: the answer is cut to fit, and a
            # history that already fills the context is the policy's failure, not a crash.
            limit = getattr(model.config, "max_position_embeddings", None)
            budget = (
                self.settings.max_tokens
                if limit is None
                else min(self.settings.max_tokens, int(limit) - prompt_len)
            )
            if budget <= 0:
                raise PolicyError(
                    f"the conversation ({prompt_len} tokens) fills {self.path}'s context of {limit} tokens"
                )
            config = _transformers().GenerationConfig(
                do_sample=False,
                max_new_tokens=budget,
                eos_token_id=eos,
                pad_token_id=pad,
            )
            try:
                with torch.inference_mode():
                    output = model.generate(**encoded, generation_config=config)
            except (RuntimeError, ValueError, IndexError) as e:
                raise PolicyError(f"generation with {self.path} failed: {e}") from e
            new_tokens = output[0, prompt_len:]
            text = tokenizer.decode(new_tokens, skip_special_tokens=True)
            return str(text), prompt_len, int(new_tokens.shape[0])

    async def respond(self, request: PolicyRequest) -> PolicyResponse:
        started = time.perf_counter()
        text, prompt_tokens, completion_tokens = await asyncio.to_thread(
            self._generate, request.messages
        )
        return PolicyResponse(
            text=text,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            latency_ms=(time.perf_counter() - started) * 1000.0,
            finish_reason="length" if completion_tokens >= self.settings.max_tokens else "stop",
            model=str(self.path),
        )

    async def aclose(self) -> None:
        with self._lock:
            self._model = None
            self._tokenizer = None
