"""Policies behind one async interface, built from spec strings by `make_policy`.

Spec strings (documented in docs/protocol.md, "Policies"):

    scripted:oracle                         replay the task's reference solution
    scripted:noisy[?kind=rate&…]            the oracle with seeded perturbations
    scripted:idle                           answer <final> at once
    openai:<base_url>#<model>[?key=value&…] an OpenAI-compatible endpoint
    hf:<checkpoint dir>                     a local transformers checkpoint

`openai:` query keys: temperature, max_tokens, native_tools (true/false), timeout
(seconds per request), max_retries, prompt_style (full/compact: the system prompt the
endpoint's model is shown; `compact` for a checkpoint trained on it). `scripted:noisy` keys: the fields of `NoisyRates`.
"""

from __future__ import annotations

from urllib.parse import parse_qsl

from agent.errors import PolicySpecError
from agent.policies.base import Policy, PolicyRequest, PolicyResponse
from agent.policies.hf import HFPolicy
from agent.policies.openai_compat import OpenAIPolicy
from agent.policies.scripted import PERTURBATION_KINDS, IdlePolicy, NoisyPolicy, OraclePolicy
from agent.settings import NoisyRates, PolicySettings

__all__ = [
    "PERTURBATION_KINDS",
    "HFPolicy",
    "IdlePolicy",
    "NoisyPolicy",
    "OpenAIPolicy",
    "OraclePolicy",
    "Policy",
    "PolicyRequest",
    "PolicyResponse",
    "make_policy",
]

_OPENAI_KEYS = {
    "temperature": "temperature",
    "max_tokens": "max_tokens",
    "native_tools": "native_tools",
    "timeout": "request_timeout_s",
    "max_retries": "max_retries",
    "prompt_style": "prompt_style",
}


def _query(spec: str, query: str) -> dict[str, str]:
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError as e:
        raise PolicySpecError(f"policy spec {spec!r}: malformed query {query!r}") from e
    out: dict[str, str] = {}
    for key, value in pairs:
        if key in out:
            raise PolicySpecError(f"policy spec {spec!r}: {key!r} given twice")
        out[key] = value
    return out


def _noisy_rates(spec: str, query: str, base: NoisyRates) -> NoisyRates:
    update: dict[str, float] = {}
    for key, value in _query(spec, query).items():
        if key not in NoisyRates.model_fields:
            raise PolicySpecError(
                f"policy spec {spec!r}: unknown perturbation {key!r}; known: {', '.join(PERTURBATION_KINDS)}"
            )
        try:
            rate = float(value)
        except ValueError as e:
            raise PolicySpecError(
                f"policy spec {spec!r}: {key} must be a number in [0, 1], got {value!r}"
            ) from e
        if not 0.0 <= rate <= 1.0:
            raise PolicySpecError(f"policy spec {spec!r}: {key} must be in [0, 1], got {rate}")
        update[key] = rate
    return NoisyRates.model_validate({**base.model_dump(), **update})


def _openai(spec: str, rest: str, settings: PolicySettings) -> OpenAIPolicy:
    base_url, sep, fragment = rest.partition("#")
    model, _, query = fragment.partition("?")
    if not sep or not model or not base_url.startswith(("http://", "https://")):
        raise PolicySpecError(
            f"policy spec {spec!r}: expected openai:<http(s) base_url>#<model>[?key=value&…]"
        )
    update: dict[str, object] = {}
    for key, value in _query(spec, query).items():
        if key not in _OPENAI_KEYS:
            raise PolicySpecError(
                f"policy spec {spec!r}: unknown key {key!r}; known: {', '.join(_OPENAI_KEYS)}"
            )
        update[_OPENAI_KEYS[key]] = value
    try:
        merged = PolicySettings.model_validate({**settings.model_dump(), **update})
    except ValueError as e:
        raise PolicySpecError(f"policy spec {spec!r}: {e}") from e
    return OpenAIPolicy(base_url, model, merged, spec=spec)


def make_policy(spec: str, *, settings: PolicySettings) -> Policy:
    """Build the policy a spec string names (see the module docstring), the spec's query
    overriding `settings` (built by the entry point).

    Raises:
        PolicySpecError: unknown scheme or name, malformed query, out-of-range value.
    """
    scheme, sep, rest = spec.partition(":")
    if not sep:
        raise PolicySpecError(
            f"policy spec {spec!r}: expected <scheme>:<…> (scripted:, openai:, hf:)"
        )
    if scheme == "scripted":
        name, _, query = rest.partition("?")
        if name == "oracle" and not query:
            return OraclePolicy(spec)
        if name == "idle" and not query:
            return IdlePolicy(spec)
        if name == "noisy":
            return NoisyPolicy(_noisy_rates(spec, query, settings.noisy), spec=spec)
        raise PolicySpecError(
            f"policy spec {spec!r}: expected scripted:oracle, scripted:noisy[?…] or scripted:idle"
        )
    if scheme == "openai":
        return _openai(spec, rest, settings)
    if scheme == "hf":
        if not rest:
            raise PolicySpecError(f"policy spec {spec!r}: expected hf:<checkpoint directory>")
        return HFPolicy(rest, settings, spec=spec)
    raise PolicySpecError(
        f"policy spec {spec!r}: unknown scheme {scheme!r} (scripted:, openai:, hf:)"
    )
