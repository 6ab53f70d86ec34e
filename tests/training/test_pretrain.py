"""The copy warm-up: its chats copy what they show, and it trains a model within its time budget."""

from __future__ import annotations

import pytest

from suites.builtin import builtin_suite
from training.base_model import build_base_model, build_tokenizer, protocol_corpus
from training.errors import BaseModelError
from training.pipeline import prepare_base_model
from training.pretrain import CopyGenerator
from training.registry import get_checkpoint
from training.settings import TrainingSettings


def _settings(**update: object) -> TrainingSettings:
    base = TrainingSettings(
        vocab_size=800,
        hidden_size=32,
        intermediate_size=64,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        max_length=256,
        max_position_embeddings=512,
        architecture="qwen3",
        tokenizer_split="words",
        prompt_style="compact",
        copy_warmup_span=16,
        copy_warmup_batch_size=4,
        copy_warmup_examples=64,
        logging_steps=1,
    )
    return base.model_copy(update=update)


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    tasks = builtin_suite().instances(4, templates=["csv_to_json", "dir_tree"])
    return protocol_corpus(tasks, prompt_style="compact")


def test_every_chat_repeats_its_question(corpus) -> None:
    tokenizer = build_tokenizer(corpus, settings=_settings())
    generator = CopyGenerator(corpus, tokenizer, span_tokens=16, seed=3)
    chats = [generator.chat() for _ in range(50)]
    for user, assistant in chats:
        assert (user["role"], assistant["role"]) == ("user", "assistant")
        assert assistant["content"] == user["content"]
        assert len(tokenizer(user["content"], add_special_tokens=False)["input_ids"]) <= 24
    # Pieces of the corpus, varied, seeded.
    assert len({u["content"] for u, _ in chats}) == len(chats)
    again = CopyGenerator(corpus, tokenizer, span_tokens=16, seed=3)
    assert [again.chat() for _ in range(50)] == chats


def test_corpus_without_text_is_refused() -> None:
    tokenizer = build_tokenizer(["a b"], settings=_settings())
    with pytest.raises(BaseModelError, match="at least 8 tokens"):
        CopyGenerator(["a b"], tokenizer, span_tokens=8, seed=0)


def test_base_model_is_warmed_up_within_its_budget(engine, store, tmp_path, corpus) -> None:
    settings = _settings(copy_warmup_s=4.0)
    base_id = prepare_base_model(
        engine, store, work_dir=tmp_path / "base", corpus=corpus, settings=settings
    )
    warm = get_checkpoint(engine, base_id).metrics["copy_warmup"]
    assert warm["stopped_by_time"] and warm["steps"] >= 2
    assert 4.0 <= warm["runtime_s"] < 15.0
    # The registered model is the warmed one, not the random initialisation.
    fresh = build_base_model(tmp_path / "fresh", corpus, settings=settings)
    assert (tmp_path / "base" / "base_model_warm" / "model.safetensors").read_bytes() != (
        fresh / "model.safetensors"
    ).read_bytes()


def test_a_step_budget_wins_over_the_time_budget(engine, store, tmp_path, corpus) -> None:
    settings = _settings(copy_warmup_s=600.0, copy_warmup_steps=3)
    base_id = prepare_base_model(
        engine, store, work_dir=tmp_path / "base", corpus=corpus, settings=settings
    )
    warm = get_checkpoint(engine, base_id).metrics["copy_warmup"]
    assert warm["steps"] == 3 and not warm["stopped_by_time"]
