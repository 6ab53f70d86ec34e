"""The template syntax and the declared parameters of user suites (pure: no jail, no files)."""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from suites.expressions import ExpressionError, expand_text, expand_value, names_in
from suites.params import ParamDecl, draw_params

VALUES = {
    "n": 7,
    "price": 12.5,
    "ok": True,
    "word": "Plum",
    "numbers": [30, 4, 30, 12],
    "names": ["grace", "ada", "linus"],
    "row": {"id": 3, "tags": ["x", "y"]},
}


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("n={{ n }}", "n=7"),
        ("{{n}}{{ n }}", "77"),
        ("{{ price }} {{ ok }}", "12.5 true"),
        ("{{ word | upper }}/{{ word | lower }}", "PLUM/plum"),
        ('{{ numbers | sort | join(",") }}', "4,12,30,30"),
        ('{{ numbers | unique | reverse | join(" | ") }}', "12 | 4 | 30"),
        ("{{ names | sort | lines }}", "ada\ngrace\nlinus\n"),
        ("{{ numbers | sum }} {{ numbers | min }} {{ numbers | max }}", "76 4 30"),
        ("{{ numbers | len }} {{ numbers | first }} {{ numbers | last }}", "4 30 12"),
        ("{{ n | add(-2) | mul(3) }}", "15"),
        ("{{ price | fixed(2) }}", "12.50"),
        ("{{ row.id }} {{ row.tags[1] }} {{ names[-1] }}", "3 y linus"),
        ("{{ row | json }}", '{"id": 3, "tags": ["x", "y"]}'),
        ('echo {{ "it\'s" | shell }}', "echo 'it'\"'\"'s'"),
        ('{{ "{{" }} literal', "{{ literal"),
        ("no template } here }}", "no template } here }}"),
    ],
)
def test_expand_text(template, expected):
    assert expand_text(template, VALUES) == expected


def test_a_whole_expression_keeps_its_type():
    assert expand_value("{{ n }}", VALUES) == 7
    assert expand_value("{{ numbers | sort }}", VALUES) == [4, 12, 30, 30]
    assert expand_value(" {{ n }}", VALUES) == " 7"


def test_names_in():
    assert names_in('{{ a }} {{ b | join(",") }} {{ c.d[0] }} {{ "lit" }}') == {"a", "b", "c"}


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{{ n ", "unclosed '{{'"),
        ("{{ }}", "empty expression"),
        ("{{ nope }}", "unknown parameter 'nope'"),
        ("{{ n | frobnicate }}", "unknown filter 'frobnicate'"),
        ("{{ names | join(1, 2) }}", "takes 0 to 1 argument(s), got 2"),
        ("{{ names | join(sep) }}", "must be JSON literals"),
        ("{{ names }}", "is a list; turn it into text"),
        ("{{ word | sum }}", "`sum` in {{ word | sum }}: needs a list, got a string"),
        ("{{ names | upper }}", "needs a string, got a list"),
        ("{{ row.missing }}", "no key 'missing' in a mapping"),
        ("{{ names[5] }}", "no index [5] in a list"),
        ("{{ n.__class__ }}", "no key '__class__' in a number"),
        ("{{ __import__('os') }}", "unexpected \"('os')\" after the name"),
        ("{{ price | fixed(99) }}", "digits must be an integer 0..12"),
        ("{{ [1] | sort }}", "expected a parameter name or a quoted string"),
    ],
)
def test_expansion_errors_say_what_is_wrong(template, message):
    with pytest.raises(ExpressionError) as info:
        expand_text(template, VALUES)
    assert message in str(info.value)


def param(**kwargs: object) -> ParamDecl:
    return ParamDecl.model_validate(kwargs)


def test_every_kind_draws_from_the_seed_deterministically():
    decls = {
        "fruit": param(choice=["apple", "pear", "plum"]),
        "n": param(int=[3, 9]),
        "readings": param(ints=[10, 99], k=[2, 5]),
        "picks": param(choices=["a", "b"], k=6),
        "names": param(sample=["ada", "grace", "linus", "barbara"], k=2),
        "order": param(shuffle=[1, 2, 3, 4]),
    }
    first = draw_params(decls, random.Random(42))
    assert first == draw_params(decls, random.Random(42))
    assert first["fruit"] in {"apple", "pear", "plum"}
    assert 3 <= first["n"] <= 9
    assert 2 <= len(first["readings"]) <= 5 and all(10 <= r <= 99 for r in first["readings"])
    assert len(first["picks"]) == 6 and set(first["picks"]) <= {"a", "b"}
    assert len(set(first["names"])) == 2
    assert sorted(first["order"]) == [1, 2, 3, 4]
    seeds = [draw_params(decls, random.Random(seed)) for seed in range(10)]
    assert len({repr(values) for values in seeds}) == 10


@pytest.mark.parametrize(
    ("decl", "message"),
    [
        ({}, "give exactly one of choice, int, ints, choices, sample, shuffle"),
        ({"choice": [1], "int": [1, 2]}, "(got choice, int)"),
        ({"int": [9, 1]}, "needs low <= high"),
        ({"ints": [1, 9]}, "needs `k`"),
        ({"sample": ["a", "b"], "k": 3}, "cannot draw 3 distinct items from 2"),
        ({"choice": ["a"], "k": 2}, "`k` only goes with"),
        ({"choices": ["a"], "k": [3, 1]}, "0 <= low <= high"),
        ({"choice": []}, "at least 1 item"),
        ({"chioce": ["a"]}, "Extra inputs are not permitted"),
    ],
)
def test_malformed_parameters(decl, message):
    with pytest.raises(ValidationError) as info:
        ParamDecl.model_validate(decl)
    assert message in str(info.value)
