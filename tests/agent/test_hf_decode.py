"""Continuous decoding (`agent.policies.hf_decode`) on the tiny Qwen2 checkpoint, in fp32.

What a row gets must not depend on who shares its batch: a row that joins while another
decodes, or that others join, decodes the tokens it decodes alone (greedy), with the same
logprobs; alone, it decodes what `model.generate` does. A row leaves the step it ends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.policies.hf_decode import DecodeBatch, Row, Sampling

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_checkpoint: Path) -> tuple[Any, Any]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(
        str(tiny_checkpoint), local_files_only=True
    )
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(tiny_checkpoint), local_files_only=True
    ).eval()
    return model, tokenizer


PROMPTS = [
    '<tool_call id="c1" name="read_file">',
    "<final>done</final> system user assistant tool You are an agent working inside a sandbox.",
    "user tool",
]


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text)["input_ids"])


def _batch(model: Any, tokenizer: Any, sampling: Sampling | None = None) -> DecodeBatch:
    return DecodeBatch(
        model,
        eos=None,  # run every row to its budget: lengths are what the test sets
        pad=tokenizer.pad_token_id,
        sampling=sampling or Sampling(),
    )


def _run(batch: DecodeBatch, rows: list[Row], *, join_after: dict[int, int]) -> list[Row]:
    """Decode until every row ended; row i joins after `join_after[i]` steps (0: at once)."""
    done: list[Row] = []
    step = 0
    pending = dict(enumerate(rows))
    while pending or len(batch):
        joining = [r for i, r in pending.items() if join_after.get(i, 0) <= step]
        for i in [i for i, r in pending.items() if r in joining]:
            del pending[i]
        done += batch.admit(joining)
        done += batch.step()
        step += 1
    return done


def test_a_row_decodes_alone_what_generate_decodes(model_and_tokenizer) -> None:
    model, tokenizer = model_and_tokenizer
    prompt = _ids(tokenizer, PROMPTS[1])
    (row,) = _run(_batch(model, tokenizer), [Row("a", prompt, 12)], join_after={})
    with torch.inference_mode():
        out = model.generate(
            input_ids=torch.tensor([prompt]),
            attention_mask=torch.ones((1, len(prompt)), dtype=torch.long),
            do_sample=False,
            max_new_tokens=12,
            min_new_tokens=12,
            pad_token_id=tokenizer.pad_token_id,
        )
    assert row.tokens == out[0, len(prompt) :].tolist()
    assert len(row.logprobs) == 12 and all(lp <= 0.0 for lp in row.logprobs)


def test_rows_that_join_and_leave_decode_what_they_decode_alone(model_and_tokenizer) -> None:
    """Three prompts of different lengths and budgets: one starts, one joins after 3 steps,
    one after 5; the first leaves before the last joins' end. Tokens equal, logprobs close."""
    model, tokenizer = model_and_tokenizer
    prompts = [_ids(tokenizer, p) for p in PROMPTS]
    budgets = [6, 14, 9]
    alone = [
        _run(_batch(model, tokenizer), [Row(i, p, b)], join_after={})[0]
        for i, (p, b) in enumerate(zip(prompts, budgets, strict=True))
    ]
    batch = _batch(model, tokenizer)
    together = _run(
        batch,
        [Row(i, p, b) for i, (p, b) in enumerate(zip(prompts, budgets, strict=True))],
        join_after={1: 3, 2: 5},
    )
    assert [r.key for r in together] == [0, 2, 1]  # ended in order of their last step
    by_key = {r.key: r for r in together}
    for row in alone:
        assert by_key[row.key].tokens == row.tokens
        assert torch.allclose(
            torch.tensor(by_key[row.key].logprobs), torch.tensor(row.logprobs), atol=1e-5
        )
    assert batch.prefills == 3 and len(batch) == 0


def test_a_row_leaves_the_step_it_ends_and_the_cache_shrinks(model_and_tokenizer) -> None:
    model, tokenizer = model_and_tokenizer
    batch = _batch(model, tokenizer)
    short, long_ = (
        Row("short", _ids(tokenizer, PROMPTS[2]), 2),
        Row("long", _ids(tokenizer, PROMPTS[1]), 8),
    )
    assert batch.admit([short, long_]) == []
    assert batch.step() == [short] and len(short.tokens) == 2
    assert [r.key for r in batch.rows] == ["long"]
    # Only the long row's columns are left: its prompt and the tokens it decoded so far.
    cache = batch._cache  # the merged cache is the class's own state: read, not changed
    assert cache.layers[0].keys.shape[0] == 1
    assert cache.layers[0].keys.shape[2] == len(long_.prompt) + len(long_.tokens) - 1
    ended: list[Row] = []
    while len(batch):
        ended += batch.step()
    assert ended == [long_] and len(long_.tokens) == 8


def test_seeded_rows_repeat_their_draws_whoever_shares_the_batch(model_and_tokenizer) -> None:
    model, tokenizer = model_and_tokenizer
    sampling = Sampling(do_sample=True, temperature=1.3)

    def draw(join_after: dict[int, int]) -> dict[int, list[int]]:
        rows = [
            Row(i, _ids(tokenizer, p), 10, generator=torch.Generator().manual_seed(100 + i))
            for i, p in enumerate(PROMPTS)
        ]
        return {
            r.key: r.tokens
            for r in _run(_batch(model, tokenizer, sampling), rows, join_after=join_after)
        }

    assert draw({}) == draw({1: 2, 2: 7})
    assert (
        draw({})[0]
        != _run(_batch(model, tokenizer), [Row(0, _ids(tokenizer, PROMPTS[0]), 10)], join_after={})[
            0
        ].tokens
    )  # sampling at 1.3 is not the greedy answer


def test_top_p_keeps_draws_inside_the_nucleus(model_and_tokenizer) -> None:
    """A nucleus of (almost) no mass holds only the most likely token: the draw is greedy,
    and the recorded logprob is of the whole distribution, before the cut."""
    model, tokenizer = model_and_tokenizer
    prompt = _ids(tokenizer, PROMPTS[1])
    greedy = _run(_batch(model, tokenizer), [Row(0, prompt, 10)], join_after={})[0]
    nucleus = _run(
        _batch(model, tokenizer, Sampling(do_sample=True, temperature=1.0, top_p=1e-6)),
        [Row(0, prompt, 10, generator=torch.Generator().manual_seed(5))],
        join_after={},
    )[0]
    assert nucleus.tokens == greedy.tokens
    assert torch.allclose(torch.tensor(nucleus.logprobs), torch.tensor(greedy.logprobs), atol=1e-6)


def test_a_turn_after_a_kept_cache_decodes_what_a_full_prefill_does(model_and_tokenizer) -> None:
    """An episode's next turn, its prompt the last turn's prompt and answer plus a tail,
    prefilled from the cache the last turn left (`Row.kv`) or whole: same tokens, same
    logprobs; the kept cache covers the prompt and every answer token but the last."""
    model, tokenizer = model_and_tokenizer
    first = Row("t1", _ids(tokenizer, PROMPTS[1]), 7)
    batch = DecodeBatch(
        model, eos=None, pad=tokenizer.pad_token_id, sampling=Sampling(), keep_kv=True
    )
    other = Row("other", _ids(tokenizer, PROMPTS[0]), 12)  # a longer neighbour: padding
    _run(batch, [other, first], join_after={1: 2})
    assert first.kv is not None
    assert first.kv[0][0].shape[2] == len(first.prompt) + len(first.tokens) - 1
    sent = first.prompt + first.tokens
    second = sent + _ids(tokenizer, " tool user")
    cached = Row("t2", second, 9, prefix=first.kv, prefix_len=len(sent) - 1)
    whole = Row("t2", second, 9)
    (cached_out,) = _run(_batch(model, tokenizer), [cached], join_after={})
    (whole_out,) = _run(_batch(model, tokenizer), [whole], join_after={})
    assert cached_out.tokens == whole_out.tokens
    assert torch.allclose(
        torch.tensor(cached_out.logprobs), torch.tensor(whole_out.logprobs), atol=1e-5
    )
