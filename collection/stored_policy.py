"""Policies that name a model in the registry: `hf:checkpoint/<id>` and `hf:alias/<name>`.

A collection whose `--policy` names a registry checkpoint, directly or by a model alias
(`training.aliases`), runs that checkpoint's `hf:` policy: the alias is read once, when
the collection opens (the run keeps that model even if the alias moves meanwhile), the
checkpoint is fetched into a scratch directory that lives as long as the collection, and
its episodes are labelled `hf:checkpoint/<id>` (the model itself, which an alias is not).
"""

from __future__ import annotations

import contextlib
import uuid

from sqlalchemy import Engine

from agent.policies.base import Policy
from agent.settings import PolicySettings
from collection.errors import RequestError
from storage.objects import ObjectStore

__all__ = ["STORED_POLICY_PREFIXES", "stored_checkpoint", "stored_policy"]

STORED_POLICY_PREFIXES = ("hf:checkpoint/", "hf:alias/")
"""Policy specs naming a checkpoint in the registry, directly or by a model alias."""


def stored_checkpoint(spec: str, engine: Engine) -> uuid.UUID | None:
    """The checkpoint `hf:checkpoint/<id>` or `hf:alias/<name>` names now (an alias is
    read once, when the collection opens: the run keeps that model even if the alias
    moves meanwhile); None for any other spec.

    Raises:
        RequestError: a malformed id, or an alias never set.
    """
    from training.aliases import alias_target

    if spec.startswith("hf:checkpoint/"):
        raw = spec.removeprefix("hf:checkpoint/")
        try:
            return uuid.UUID(raw)
        except ValueError as e:
            raise RequestError(
                f"--policy {spec!r}: {raw!r} is not a checkpoint id", setting="--policy"
            ) from e
    if spec.startswith("hf:alias/"):
        name = spec.removeprefix("hf:alias/")
        target = alias_target(engine, name)
        if target is None or target.checkpoint_id is None:
            raise RequestError(
                f"--policy {spec!r}: model alias {name!r} "
                + (
                    "was never set"
                    if target is None
                    else f"points at {target.policy}, not a checkpoint"
                )
                + " (epiflow models list)",
                setting="--policy",
            )
        return target.checkpoint_id
    return None


def stored_policy(
    spec: str,
    settings: PolicySettings,
    engine: Engine,
    store: ObjectStore,
    scratch: contextlib.ExitStack,
) -> Policy:
    """The `hf:` policy of the registry checkpoint `spec` names, fetched into a scratch
    directory entered on `scratch` (the caller closes it when the collection closes).

    Raises:
        RequestError: a malformed id, an alias never set, or a checkpoint that cannot be
            fetched.
    """
    from agent.policies.hf import HFPolicy
    from core.scratch import scratch_dir
    from training.errors import RegistryError
    from training.registry import fetch_checkpoint

    checkpoint_id = stored_checkpoint(spec, engine)
    if checkpoint_id is None:
        raise RequestError(f"--policy {spec!r} names no registry checkpoint", setting="--policy")
    directory = scratch.enter_context(scratch_dir("epiflow-policy-")) / "model"
    try:
        fetch_checkpoint(engine, store, checkpoint_id, directory)
    except RegistryError as e:
        raise RequestError(f"--policy {spec!r}: {e}", setting="--policy") from e
    return HFPolicy(directory, settings, spec=f"hf:checkpoint/{checkpoint_id}")
