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
from suites.builtin import builtin_suite
from tests.training.factory import episode
from training.base_model import EOS_TOKEN, build_base_model, build_tokenizer, protocol_corpus
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
    task = builtin_suite().instances(1, templates=["csv_to_json"])[0]
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
        task=builtin_suite().instances(1, templates=["csv_to_json"])[0],
        messages=prompt_messages(traj),
        tools=list(BUILTIN_TOOLS.values()),
    )
    response = asyncio.run(policy.respond(request))
    assert response.completion_tokens is not None and 1 <= response.completion_tokens <= 8
    assert response.prompt_tokens is not None and response.prompt_tokens > 100


def _compact_words_settings() -> TrainingSettings:
    return TrainingSettings(
        vocab_size=1024,
        hidden_size=32,
        intermediate_size=64,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        max_length=512,
        max_position_embeddings=512,
        architecture="qwen3",
        tokenizer_split="words",
        prompt_style="compact",
    )


def test_words_tokenizer_gives_a_value_one_id_wherever_it_stands_and_reloads_as_trained(
    tmp_path,
):
    """The `words` split: `Lisbon` after a comma (CSV) and after a quote (JSON) is one id,
    `guests` after a space and after `">` too; a qwen3 checkpoint reloads it unchanged."""
    settings = _compact_words_settings()
    tasks = builtin_suite().instances(3, templates=["csv_to_json", "dir_tree"])
    corpus = protocol_corpus(tasks, prompt_style="compact")
    model_dir = build_base_model(tmp_path / "words", corpus, settings=settings)
    trained = build_tokenizer(corpus, settings=settings)
    loaded = load_tokenizer(model_dir)
    for text in ("Ada Lovelace,34,Lisbon\n", '"city": "Lisbon"', "Convert guests.csv", '">guests'):
        ids = loaded(text, add_special_tokens=False)["input_ids"]
        assert ids == trained(text, add_special_tokens=False)["input_ids"]
        assert loaded.decode(ids) == text
    lisbon = loaded("Lisbon", add_special_tokens=False)["input_ids"]
    assert len(lisbon) == 1
    for text in ("Ada Lovelace,34,Lisbon\n", '"city": "Lisbon"'):
        assert lisbon[0] in loaded(text, add_special_tokens=False)["input_ids"]
    # The qwen split makes them different tokens: what the words split is for.
    qwen = build_tokenizer(corpus, settings=TrainingSettings(vocab_size=1024))
    assert (
        qwen(",Lisbon", add_special_tokens=False)["input_ids"]
        != qwen('"Lisbon', add_special_tokens=False)["input_ids"][1:]
    )


def test_words_split_needs_qwen3():
    with pytest.raises(ValueError, match="needs architecture 'qwen3'"):
        TrainingSettings(tokenizer_split="words")


def test_compact_checkpoint_is_shown_the_compact_prompt(tmp_path):
    """The prompt style recorded in the checkpoint is the one the hf: policy shows."""
    from agent.prompt import render_system_prompt

    settings = _compact_words_settings()
    corpus = protocol_corpus(prompt_style="compact")
    model_dir = build_base_model(tmp_path / "compact", corpus, settings=settings)
    policy = HFPolicy(model_dir, PolicySettings(max_tokens=4))
    tools = list(BUILTIN_TOOLS.values())
    assert policy.system_prompt(tools) == render_system_prompt(tools, "compact")
    assert policy.system_prompt(tools).startswith("Protocol v1.")
    # A fifth of the full prompt (~700 tokens), even with the words split.
    assert len(load_tokenizer(model_dir)(policy.system_prompt(tools))["input_ids"]) < 150
