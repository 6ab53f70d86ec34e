"""The base model built without downloads: tokenizer, chat template, loadable by the hf: policy."""

from __future__ import annotations

import asyncio
import importlib.resources

import pytest

from agent.policies.base import PolicyRequest
from agent.policies.hf import HFPolicy
from agent.render import render_tool_call
from agent.settings import PolicySettings
from sandbox.tool_specs import BUILTIN_TOOLS
from suites.registry import load_suite
from tests.training.factory import episode
from training.base_model import EOS_TOKEN, build_tokenizer, protocol_corpus
from training.conversations import episode_messages, prompt_messages
from training.errors import BaseModelError
from training.settings import TrainingSettings
from training.trainers.common import load_tokenizer


def test_saved_tokenizer_splits_text_like_the_trained_one(
    tiny_base_model, tiny_corpus, tiny_settings
):
    trained = build_tokenizer(tiny_corpus, settings=tiny_settings)
    loaded = load_tokenizer(tiny_base_model)
    samples = [
        render_tool_call("c1", "execute_shell", {"command": "wc -l data/*.csv | sort -n 12345"}),
        "x = 12345 + 678; it's   spaced\n\n\nlines ÄÖÜ 42nd 日本",
    ]
    for text in samples:
        ids = loaded(text, add_special_tokens=False)["input_ids"]
        assert ids == trained(text, add_special_tokens=False)["input_ids"]
        assert loaded.decode(ids) == text


def test_chat_template_is_trls_qwen_template_verbatim(tiny_base_model):
    shipped = (importlib.resources.files("trl") / "chat_templates" / "qwen2_5.jinja").read_text()
    tokenizer = load_tokenizer(tiny_base_model)
    assert tokenizer.chat_template == shipped
    assert tokenizer.eos_token == EOS_TOKEN
    rendered = tokenizer.apply_chat_template(episode_messages(episode()), tokenize=False)
    assert rendered.startswith("<|im_start|>system\nYou are an agent")
    assert rendered.count("<|im_start|>assistant\n") == 2


def test_system_prompt_and_task_fit_max_length(tiny_base_model, tiny_settings):
    tokenizer = load_tokenizer(tiny_base_model)
    ids = tokenizer.apply_chat_template(prompt_messages(episode()), add_generation_prompt=True)
    assert len(ids["input_ids"]) < tiny_settings.max_length - 200


def test_corpus_covers_protocol_text():
    task = load_suite("builtin").instances(1, templates=["csv_to_json"])[0]
    corpus = protocol_corpus([task])
    assert any("<tool_call" in t for t in corpus)
    assert any("<final>" in t for t in corpus)
    assert task.prompt in corpus


def test_empty_corpus_is_refused():
    with pytest.raises(BaseModelError):
        build_tokenizer([], settings=TrainingSettings())


def test_bad_model_shape_is_refused():
    with pytest.raises(ValueError, match="multiple of num_heads"):
        TrainingSettings(hidden_size=30, num_heads=4)


def test_hf_policy_loads_and_generates(tiny_base_model):
    policy = HFPolicy(tiny_base_model, PolicySettings(max_tokens=8))
    traj = episode()
    request = PolicyRequest(
        task=load_suite("builtin").instances(1, templates=["csv_to_json"])[0],
        messages=prompt_messages(traj),
        tools=list(BUILTIN_TOOLS.values()),
    )
    response = asyncio.run(policy.respond(request))
    assert response.completion_tokens is not None and 1 <= response.completion_tokens <= 8
    assert response.prompt_tokens is not None and response.prompt_tokens > 100
