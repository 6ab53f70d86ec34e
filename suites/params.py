"""Seeded parameters of a user template: declared in `suite.yaml`, drawn from the seed.

    params:
      word:    {choice: [apple, pear, plum]}       one item
      n:       {int: [3, 12]}                      an integer, both ends included
      numbers: {ints: [1, 999], k: [8, 14]}        k integers (k itself drawn from a range)
      picks:   {choices: [a, b, c], k: 5}          k items, with replacement
      names:   {sample: [ada, grace, linus], k: 2} k distinct items, in drawn order
      order:   {shuffle: [x, y, z]}                the items in a random order

Parameters are drawn in declaration order from the template's `random.Random(seed)`, so
the same (template, version, seed) always gives the same values; adding, removing or
reordering parameters changes every instance (bump the task's version). Pure.
"""

from __future__ import annotations

import random
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

PARAM_NAME = r"^[a-z_][a-z0-9_]*$"
"""Parameter names: usable in `{{ … }}` and as keys of `params.json`."""
MAX_K = 10_000
"""Most items one list parameter may draw."""

Scalar = str | int | float | bool
_KINDS = ("choice", "int", "ints", "choices", "sample", "shuffle")


def _count_range(value: Any) -> Any:
    # `k: 5` is shorthand for `k: [5, 5]`.
    if isinstance(value, int) and not isinstance(value, bool):
        return [value, value]
    return value


class ParamDecl(BaseModel):
    """One seeded parameter: exactly one of the kinds below, plus `k` for list kinds."""

    model_config = ConfigDict(extra="forbid")

    choice: list[Scalar] | None = Field(default=None, min_length=1)
    """One item of the list."""
    int_: list[int] | None = Field(default=None, alias="int", min_length=2, max_length=2)
    """`[low, high]`: an integer in that range, both ends included."""
    ints: list[int] | None = Field(default=None, min_length=2, max_length=2)
    """`[low, high]`: `k` integers in that range, with replacement."""
    choices: list[Scalar] | None = Field(default=None, min_length=1)
    """`k` items of the list, with replacement."""
    sample: list[Scalar] | None = Field(default=None, min_length=1)
    """`k` distinct items of the list (positions, not values: list each value once)."""
    shuffle: list[Scalar] | None = Field(default=None, min_length=1)
    """All items, in a random order."""
    k: Annotated[list[int] | None, Field(min_length=2, max_length=2)] = None
    """How many items `ints`, `choices` and `sample` draw: a number, or `[low, high]`."""

    @model_validator(mode="before")
    @classmethod
    def _k_shorthand(cls, value: Any) -> Any:
        if isinstance(value, dict) and "k" in value:
            return {**value, "k": _count_range(value["k"])}
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> ParamDecl:
        given = [kind for kind in _KINDS if getattr(self, _attr(kind)) is not None]
        if len(given) != 1:
            raise ValueError(
                f"give exactly one of {', '.join(_KINDS)}"
                + (f" (got {', '.join(given)})" if given else "")
            )
        kind = given[0]
        bounds = self.int_ if kind == "int" else self.ints if kind == "ints" else None
        if bounds is not None and bounds[0] > bounds[1]:
            raise ValueError(f"`{kind}: [low, high]` needs low <= high, got {bounds}")
        if kind in ("ints", "choices", "sample"):
            if self.k is None:
                raise ValueError(f"`{kind}` needs `k`: how many items (a number or [low, high])")
            low, high = self.k
            if not 0 <= low <= high <= MAX_K:
                raise ValueError(f"`k` must be 0 <= low <= high <= {MAX_K}, got {self.k}")
            if kind == "sample" and self.sample is not None and high > len(self.sample):
                raise ValueError(
                    f"`sample` cannot draw {high} distinct items from {len(self.sample)}"
                )
        elif self.k is not None:
            raise ValueError(f"`k` only goes with ints, choices or sample, not `{kind}`")
        return self

    @property
    def kind(self) -> str:
        """Which kind of parameter this is."""
        return next(kind for kind in _KINDS if getattr(self, _attr(kind)) is not None)

    def draw(self, rng: random.Random) -> Any:
        """This parameter's value for `rng`'s next draws."""
        if self.choice is not None:
            return rng.choice(self.choice)
        if self.int_ is not None:
            return rng.randint(self.int_[0], self.int_[1])
        if self.shuffle is not None:
            items = list(self.shuffle)
            rng.shuffle(items)
            return items
        assert self.k is not None  # the validator requires it for the list kinds
        k = rng.randint(self.k[0], self.k[1])
        if self.ints is not None:
            return [rng.randint(self.ints[0], self.ints[1]) for _ in range(k)]
        if self.choices is not None:
            return rng.choices(self.choices, k=k)
        assert self.sample is not None
        return rng.sample(self.sample, k)


def _attr(kind: str) -> str:
    return "int_" if kind == "int" else kind


def draw_params(decls: dict[str, ParamDecl], rng: random.Random) -> dict[str, Any]:
    """Every parameter's value, drawn in declaration order."""
    return {name: decl.draw(rng) for name, decl in decls.items()}
