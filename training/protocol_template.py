"""Whether a base's chat template can render protocol v1 for agentic GRPO.

An episode is a chat: the system prompt (the protocol and the tools), the task as a user
turn, then assistant turns (tool calls, the final answer) and user turns (each tool
result). GRPO trains on the ids the model sampled, each turn's prompt extending the
previous turn's prompt and answer (`agent.policies.hf_tokens.ChatTokens`). That needs a
chat template which

1. exists: without one the `hf:` policy renders plain `role: content` lines, a format
   the model was never trained on and that its served checkpoint would not use;
2. renders a protocol chat without raising, every message's content in order: a
   template that drops (or refuses) the system role loses the protocol and the tools, one
   that drops or merges the user turns after the task loses the tool results;
3. writes an answer verbatim after its generation prompt and renders earlier turns the
   same once later ones follow (`ChatTokens`'s own rule, run here on the chat): otherwise
   every turn after the first is a full render and GRPO stops at its first batch
   (`TokenPrefixError`).

`protocol_template_problem(tokenizer)` renders one short protocol chat with the
tokenizer the trainer would use and returns the first problem as a phrase that completes
"its chat template …", or None. `collection.grpo_training` refuses such a base before it
opens a run or starts a jail.
"""

from __future__ import annotations

from typing import Any

from agent.policies.hf_tokens import ChatTokens
from agent.render import render_final, render_tool_call
from agent.trajectory import Step
from core.errors import reason_line

__all__ = ["PROTOCOL_CHAT", "protocol_template_problem"]

PROTOCOL_CHAT: list[dict[str, Any]] = [
    {"role": "system", "content": "You act through protocol v1 (epiflow system prompt)."},
    {"role": "user", "content": "List the files of /work (epiflow task)."},
    {"role": "assistant", "content": render_tool_call("c1", "list_dir", {"path": "/work"})},
    {"role": "user", "content": '<tool_result id="c1">a.txt (epiflow observation)</tool_result>'},
    {"role": "assistant", "content": render_final("a.txt")},
]
"""A protocol v1 episode as the loop's history: system, task, call, result, final answer."""

_WHAT = {
    "system": "the system message (the protocol and its tools)",
    "user": "a user turn (the task or a tool result)",
    "assistant": "an assistant turn",
}


def protocol_template_problem(tokenizer: Any) -> str | None:
    """What keeps `tokenizer`'s chat template from rendering protocol v1 for GRPO (a phrase
    completing "its chat template …"), or None when nothing does (see the module)."""
    chat = ChatTokens(tokenizer)
    if not chat.templated:
        return "is missing (the tokenizer has no chat_template)"
    try:
        text = chat.render(PROTOCOL_CHAT, generation_prompt=False)
        first = chat.render(PROTOCOL_CHAT[:2], generation_prompt=True)
        answer = PROTOCOL_CHAT[2]["content"]
        done = Step(
            index=0,
            history_hash="",
            raw_output=answer,
            prompt_token_ids=chat.encode(first),
            completion_token_ids=chat.encode(answer),
            logprobs=None,
        )
        extended = chat.prompt_ids(PROTOCOL_CHAT[:4], [done])
    except Exception as e:  # a template's `raise_exception(...)`, any Jinja error
        return f"fails on a protocol chat: {reason_line(str(e) or type(e).__name__, 160)}"
    at = 0
    for message in PROTOCOL_CHAT:
        found = text.find(message["content"], at)
        if found < 0:
            return f"drops {_WHAT[message['role']]}"
        at = found + len(message["content"])
    if not extended.extended:
        return f"breaks token-exact turns: {extended.fallback}"
    return None
