"""Training twins of chat templates TRL does not know: the same text, with `{% generation %}`.

TRL's assistant-only loss needs a chat template that marks the assistant's tokens with
`{% generation %}…{% endgeneration %}`; it swaps in such a twin for the templates it ships
(`qwen2_5.jinja`, the small models' template, among them) and refuses the others.
SmolLM2-Instruct's template (`training.pretrained.SMOLLM2`) is not among them, so its
twin is here: it renders every chat exactly as the original does (`generation` is a no-op
outside training; `tests/training/test_chat_templates.py` compares the two), and the
assistant's `<|im_end|>` lies inside the markers, so the model learns to stop.

`load_tokenizer` (`training.trainers.common`) swaps the twin in when a checkpoint carries
the original; the trained checkpoint is saved with the twin, which `transformers serve`
and the `hf:` policy render as the original.
"""

from __future__ import annotations

__all__ = ["SMOLLM2_CHAT_TEMPLATE", "SMOLLM2_TRAINING_CHAT_TEMPLATE", "training_twin"]

SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""SmolLM2-135M-Instruct's chat template, as its GGUF ships it."""

SMOLLM2_TRAINING_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\n' }}{% generation %}{{ message['content'] + '<|im_end|>' }}"
    "{% endgeneration %}{{ '\n' }}{% else %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""The same rendering with the assistant's content and `<|im_end|>` inside `generation`."""

_TWINS = {SMOLLM2_CHAT_TEMPLATE.strip(): SMOLLM2_TRAINING_CHAT_TEMPLATE}


def training_twin(template: object) -> str | None:
    """The generation-marked twin of `template`, or None when there is none here (TRL's own
    templates, templates that already have the markers, unknown ones)."""
    if not isinstance(template, str):
        return None
    return _TWINS.get(template.strip())
