"""SmolLM2's training twin (`training.chat_templates`): the chat renders exactly as the
shipped template renders it, and the assistant mask is every assistant turn with its
`<|im_end|>` and nothing else, so TRL's assistant-only loss trains what the served model
is asked to write (rendered with the tiny base model's tokenizer, which has the same
`<|im_start|>`/`<|im_end|>` tokens)."""

from __future__ import annotations

from pathlib import Path

from training.chat_templates import (
    SMOLLM2_CHAT_TEMPLATE,
    SMOLLM2_TRAINING_CHAT_TEMPLATE,
    training_twin,
)
from training.protocol_template import protocol_template_problem
from training.trainers.common import load_tokenizer

CHAT = [
    {"role": "system", "content": "Protocol v1."},
    {"role": "user", "content": "Make a folder."},
    {"role": "assistant", "content": '<tool_call id="c1" name="list_dir">\n</tool_call>'},
    {"role": "user", "content": '<tool_result id="c1">ok</tool_result>'},
    {"role": "assistant", "content": "<final>done</final>"},
]


def test_the_twin_renders_as_the_original_and_masks_the_assistant_turns(
    tiny_base_model: Path,
) -> None:
    tokenizer = load_tokenizer(tiny_base_model)
    for chat, prompt in ((CHAT, False), (CHAT[:4], True), (CHAT[1:2], True)):
        assert tokenizer.apply_chat_template(
            chat,
            chat_template=SMOLLM2_TRAINING_CHAT_TEMPLATE,
            tokenize=False,
            add_generation_prompt=prompt,
        ) == tokenizer.apply_chat_template(
            chat,
            chat_template=SMOLLM2_CHAT_TEMPLATE,
            tokenize=False,
            add_generation_prompt=prompt,
        )
    encoded = tokenizer.apply_chat_template(
        CHAT,
        chat_template=SMOLLM2_TRAINING_CHAT_TEMPLATE,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    masked = [i for i, m in zip(encoded["input_ids"], encoded["assistant_masks"], strict=True) if m]
    expected = "".join(m["content"] + "<|im_end|>" for m in CHAT if m["role"] == "assistant")
    assert tokenizer.decode(masked) == expected


def test_only_the_shipped_template_has_a_twin() -> None:
    assert training_twin(SMOLLM2_CHAT_TEMPLATE) == SMOLLM2_TRAINING_CHAT_TEMPLATE
    assert training_twin(SMOLLM2_CHAT_TEMPLATE + "\n") == SMOLLM2_TRAINING_CHAT_TEMPLATE
    assert training_twin(SMOLLM2_TRAINING_CHAT_TEMPLATE) is None
    assert training_twin(None) is None


# ------------------------------------------------- can a base's template render the protocol

DROPS_SYSTEM = (  # Gemma-like: only user and assistant turns are rendered
    "{% for m in messages %}{% if m['role'] != 'system' %}<|im_start|>{{ m['role'] }}\n"
    "{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
REFUSES_SYSTEM = (
    "{% for m in messages %}{% if m['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LAST_USER_ONLY = (  # keeps the system prompt and the newest user turn: the task is lost
    "<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n"
    "{% for m in messages[1:] %}{% if m['role'] == 'assistant' or loop.last %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MARKS_THE_LAST_ANSWER = (  # an earlier turn renders differently once later ones follow
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% if loop.last and m['role'] == 'assistant' %} (latest){% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_template_that_cannot_render_the_protocol_is_named(tiny_base_model: Path) -> None:
    tokenizer = load_tokenizer(tiny_base_model)
    assert protocol_template_problem(tokenizer) is None  # the local base (TRL's Qwen 2.5)
    tokenizer.chat_template = SMOLLM2_TRAINING_CHAT_TEMPLATE
    assert protocol_template_problem(tokenizer) is None
    for template, problem in (
        (None, "is missing (the tokenizer has no chat_template)"),
        (DROPS_SYSTEM, "drops the system message (the protocol and its tools)"),
        (REFUSES_SYSTEM, "fails on a protocol chat: System role not supported"),
        (LAST_USER_ONLY, "drops a user turn (the task or a tool result)"),
        (MARKS_THE_LAST_ANSWER, "breaks token-exact turns: the chat template renders"),
    ):
        tokenizer.chat_template = template
        found = protocol_template_problem(tokenizer)
        assert found is not None and found.startswith(problem), (template, found)
