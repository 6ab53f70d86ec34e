"""Filling a `Step` at the record points of seed 000 §4.2, and the chat messages each step adds.

Kept apart from the loop's control flow so each record point is one small function:
after the response (`record_response`), after parsing (`record_parse`, `record_parse_error`)
and after execution (`record_result`).
"""

from __future__ import annotations

from typing import Any

from agent.errors import ProtocolError
from agent.policies.base import PolicyResponse
from agent.protocol import ParsedMessage
from agent.render import decode_step_text, render_tool_error, render_tool_result, render_warning
from agent.settings import LoopSettings
from agent.trajectory import ParseKind, Step
from sandbox.types import ToolResult

__all__ = [
    "NO_BLOCK_CODE",
    "assistant_message",
    "observation_messages",
    "record_parse",
    "record_parse_error",
    "record_response",
    "record_result",
    "repetition_warning_text",
    "soft_timeout_warning_text",
]

NO_BLOCK_CODE = "no_block"
NO_BLOCK_MESSAGE = (
    "your message has no <tool_call> or <final> block: end every message with exactly one "
    '<tool_call id="…" name="…">…</tool_call> or <final>…</final>'
)


def record_response(
    step: Step, response: PolicyResponse, *, latency_ms: float, settings: LoopSettings
) -> str:
    """Raw text (capped), tokens (counts, and the ids and logprobs the policy sampled,
    uncapped), latency, native calls, retries, the answering model, perturbation; returns
    the text to parse."""
    text = response.text
    if len(text) > settings.max_output_chars:
        text = text[: settings.max_output_chars]
        step.raw_output_truncated = True
    step.raw_output = text
    step.prompt_tokens = response.prompt_tokens
    step.completion_tokens = response.completion_tokens
    step.prompt_token_ids = response.prompt_token_ids
    step.completion_token_ids = response.completion_token_ids
    step.logprobs = response.logprobs
    step.generation_latency_ms = latency_ms
    step.native_tool_calls = response.native_tool_calls
    step.finish_reason = response.finish_reason
    step.endpoint_retries = response.retries
    step.response_model = response.model
    step.policy_perturbation = response.perturbation
    return text


def record_parse(step: Step, parsed: ParsedMessage, *, latency_ms: float) -> None:
    """A successful parse: kind, tolerances, call id, tool, args or the final answer."""
    step.parse_latency_ms = latency_ms
    step.parse_kind = parsed.kind
    step.parse_tolerances = list(parsed.tolerances)
    if parsed.call is not None:
        step.call_id = parsed.call.call_id
        step.tool = parsed.call.tool
        step.args = dict(parsed.call.args)
    if parsed.final is not None:
        step.final_answer = parsed.final
    if parsed.kind == ParseKind.NONE:
        step.parse_error = NO_BLOCK_MESSAGE
        step.parse_error_code = NO_BLOCK_CODE
        step.observation = render_tool_error(NO_BLOCK_MESSAGE, code=NO_BLOCK_CODE)


def record_parse_error(step: Step, error: ProtocolError, *, latency_ms: float) -> None:
    """A failed parse: the error, what was read before it, and the `<tool_error>` observation."""
    step.parse_latency_ms = latency_ms
    step.parse_kind = ParseKind.ERROR
    step.parse_error = error.message
    step.parse_error_code = error.code
    step.call_id = error.call_id
    step.tool = error.tool
    step.observation = render_tool_error(
        error.message, code=error.code, call_id=error.call_id, tool=error.tool
    )


def soft_timeout_warning_text() -> str:
    return render_warning(
        "soft_timeout",
        "the episode passed its soft time limit: finish now and give your <final> answer; "
        "the sandbox will be stopped at the hard limit",
    )


def repetition_warning_text(count: int) -> str:
    return render_warning(
        "repetition",
        f"this is the same call with the same args {count} times in a row; "
        "its result will not change: try something else or give your <final> answer",
    )


def record_result(
    step: Step, result: ToolResult, *, settings: LoopSettings, repetition_warning: bool
) -> None:
    """Execution: exit code, output (bytes and capped text), duration, rusage, files, fault, warnings."""
    step.exit_code = result.exit_code
    step.signal = result.signal
    step.timed_out = result.timed_out
    step.error_type = result.error_type
    step.stdout_bytes = result.stdout
    step.stderr_bytes = result.stderr
    step.stdout, out_cut = decode_step_text(result.stdout, settings.step_text_max_chars)
    step.stderr, err_cut = decode_step_text(result.stderr, settings.step_text_max_chars)
    step.stdout_truncated = result.stdout_truncated or out_cut
    step.stderr_truncated = result.stderr_truncated or err_cut
    step.duration_ms = result.duration_ms
    step.resources = result.resources
    step.files_changed = list(result.files_changed)
    step.injected_fault = result.injected_fault
    step.soft_timeout_warning = result.soft_timeout_warning
    step.repetition_warning = repetition_warning
    observation = render_tool_result(
        step.call_id or "",
        step.tool or result.tool,
        result,
        max_chars=settings.observation_max_chars,
    )
    if repetition_warning:
        observation += "\n" + repetition_warning_text(step.repeat_count)
    if result.soft_timeout_warning:
        observation += "\n" + soft_timeout_warning_text()
    step.observation = observation


def assistant_message(step: Step) -> dict[str, Any]:
    """The assistant turn as it goes into the history (native calls kept as the endpoint sent them)."""
    message: dict[str, Any] = {"role": "assistant", "content": step.raw_output}
    if step.native_tool_calls:
        message["tool_calls"] = step.native_tool_calls
    return message


def observation_messages(step: Step) -> list[dict[str, Any]]:
    """The observation turn(s): `tool` messages answering native calls, else one `user` message."""
    if step.observation is None:
        return []
    if step.native_tool_calls:
        out = []
        for i, call in enumerate(step.native_tool_calls):
            call_id = call.get("id") if isinstance(call, dict) else None
            tool_call_id = (
                call_id if isinstance(call_id, str) and call_id else (step.call_id or f"call_{i}")
            )
            out.append({"role": "tool", "tool_call_id": tool_call_id, "content": step.observation})
        return out
    return [{"role": "user", "content": step.observation}]
