"""`TaskEnvironment`: a task that brings its own root filesystem (a Harbor task). Pure data.

A `TaskInstance` with an environment runs in a jail chrooted into its built image
(`SandboxSpec.image`) with the task's own limits, and is verified by its own `tests/test.sh`
in a verifier jail of the same image (`tasks/harbor_verify.py`) instead of a
`VerifierSpec` command in the agent's jail.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sandbox.image_spec import ImageMount
from sandbox.spec import SandboxSpec


class TaskEnvironment(BaseModel):
    """The image, limits and verifier inputs of a task with its own environment."""

    model_config = ConfigDict(frozen=True)

    kind: str = "harbor"
    """Where it comes from (`harbor`: a Harbor task directory)."""
    image: ImageMount
    """The built image the agent's and the verifier's jails chroot into."""
    limits: dict[str, Any] = Field(default_factory=dict)
    """`SandboxSpec` fields the task sets (cpus, memory_mib, workspace_mib, timeouts)."""
    tests_dir: str
    """Host folder of the task's `tests/`, bound read-only at `/tests` in the verifier jail only."""
    toolkit_dir: str
    """Host folder of the offline verifier toolkit (uv, pinned wheels, shims) at `/opt/epiflow`."""
    verifier_timeout_s: float = 600.0
    """Timeout of `tests/test.sh`."""
    reward_rule: str = "mean"
    """How named rewards without a `reward` key combine into the score (`mean`, `min`, `max`,
    `product`, `key:NAME`: `tasks/harbor_reward.py`); the suite's setting."""
    substitutions: tuple[str, ...] = ()
    """Everything mapped or ignored to build and run the task here, one line each."""
    base_substitution: str | None = None
    """The Dockerfile's base built as another distribution, codename or Python version than
    its tag names, one line ("python:3.13-slim-bookworm built as Debian trixie (Python
    3.13)", decided by `suites/harbor/bases.py` when the task loads); None: built as named.
    A reference solution's failure on such a base is the environment's
    (`agent/substituted_base.py`)."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """The task's metadata (difficulty label, category, tags, content hash, source folder)."""
    build_s: float = 0.0
    """Seconds the image's build took (when it was built, as `image.json` records it)."""
    build_error: str | None = None
    """Why the image (or the verifier's toolkit) could not be built; set, every episode of
    the task ends as `env_error` with it before a jail opens. None: built."""

    def sandbox_spec(self, base: SandboxSpec) -> SandboxSpec:
        """`base` with the task's limits and image (validated like any spec)."""
        data = base.model_dump()
        data.update(self.limits)
        data["image"] = self.image
        return SandboxSpec(**data)
