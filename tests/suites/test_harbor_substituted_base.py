"""Under the oracle, a reference solution that fails on a substituted base is the
environment's outcome, never the agent's (issue 44).

A reference solution is written for the image its Dockerfile names. The one here needs
Debian 12 (bookworm), as Terminal-Bench's `openssl-selfsigned-cert` needs bookworm's
OpenSSL output: on `python:3.13-slim-bookworm`, built here as trixie for its Python 3.13,
the oracle's failure is `env_error` `substituted-base: …` (no reward); the same failing
solution on `debian:trixie` (built as named) is `failed`; and an agent other than the
oracle failing on the substituted base is `failed`, as any agent's failure.

End to end through the real episode loop in real jails; the images (root and mmdebstrap,
`$TMPDIR/epiflow-test-images`, shared) reuse the bases the other Harbor tests build.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from suites.harbor.suite import HarborSuite, load_harbor_suite
from tests.suites.test_harbor_tasks import IMAGES, _episode, _task, builds_images, needs_builder

TOML = 'version = "1.0"\n[verifier]\ntimeout_sec = 120\n[agent]\ntimeout_sec = 60\n'
SOLVE = "#!/bin/bash\ncut -d. -f1 /etc/debian_version > /app/major\n"
"""Right on the bookworm its Dockerfile names, wrong on anything else."""
TEST_SH = (
    '#!/bin/bash\nif [ "$(cat /app/major)" = 12 ]; then echo 1; else echo 0; fi'
    " > /logs/verifier/reward.txt\n"
)
SUBSTITUTED = "python:3.13-slim-bookworm built as Debian trixie (Python 3.13)"


@pytest.fixture(scope="module")
def suite() -> Iterator[HarborSuite]:
    root = Path(tempfile.mkdtemp(dir=IMAGES.parent))
    root.chmod(0o755)
    try:
        for name, base in (
            ("substituted", "python:3.13-slim-bookworm"),
            ("as-named", "debian:trixie"),
        ):
            _task(
                root, name, toml=TOML, dockerfile=f"FROM {base}\nWORKDIR /app\n",
                test_sh=TEST_SH, solve=SOLVE,
            )  # fmt: skip
        IMAGES.mkdir(exist_ok=True)
        yield load_harbor_suite(root, name="substituted-base", images_dir=IMAGES)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_loaded_task_carries_its_base_substitution(suite: HarborSuite) -> None:
    from sandbox.images import ImageBuildError

    assert suite.plans["substituted"].base_substitution == SUBSTITUTED
    assert suite.plans["as-named"].base_substitution is None
    unbuilt = suite.unbuilt_environment("substituted", ImageBuildError("not built"))
    assert unbuilt.base_substitution == SUBSTITUTED


@needs_builder
@builds_images
def test_the_oracle_failing_on_a_substituted_base_is_an_env_error_naming_it(
    suite: HarborSuite,
) -> None:
    from agent.trajectory import EpisodeStatus, FailureCategory
    from scoring.rewards import apply_rewards
    from scoring.settings import RewardSettings

    traj = _episode(suite.generate("substituted", 0), "scripted:oracle")
    assert (traj.status, traj.failure_category) == (
        EpisodeStatus.ENV_ERROR, FailureCategory.ENV_ERROR,
    ), (traj.failure_reason, traj.verifier_details)  # fmt: skip
    reason = traj.failure_reason or ""
    assert reason.startswith("substituted-base: ") and SUBSTITUTED in reason, reason
    assert traj.verifier_reason is not None and traj.verifier_reason in reason
    rewarded = apply_rewards(traj, RewardSettings())
    assert rewarded.final_reward is None and rewarded.total_reward is None


@needs_builder
@builds_images
def test_the_oracle_failing_on_a_base_built_as_named_is_failed(suite: HarborSuite) -> None:
    from agent.trajectory import EpisodeStatus, FailureCategory

    traj = _episode(suite.generate("as-named", 0), "scripted:oracle")
    assert (traj.status, traj.failure_category) == (
        EpisodeStatus.FAILED, FailureCategory.VERIFIER_FAILED,
    ), (traj.failure_reason, traj.verifier_details)  # fmt: skip
    assert traj.verifier_score == 0.0


@needs_builder
@builds_images
def test_another_agent_failing_on_a_substituted_base_is_failed(suite: HarborSuite) -> None:
    from agent.trajectory import EpisodeStatus, FailureCategory

    traj = _episode(suite.generate("substituted", 0), "scripted:idle")
    assert (traj.status, traj.failure_category) == (
        EpisodeStatus.FAILED, FailureCategory.VERIFIER_FAILED,
    ), (traj.failure_reason, traj.verifier_details)  # fmt: skip
    assert traj.verifier_score == 0.0


@needs_builder
@builds_images
def test_suites_checks_episode_path_reports_the_substituted_base_reason(
    suite: HarborSuite,
) -> None:
    """`epiflow suites check` (and `bench/harbor.py --dataset`, which runs through it) shows
    the infrastructure outcome's own reason, not the verifier's "reward 0"."""
    import asyncio

    from cli.suites import _run_check
    from sandbox import SandboxSettings

    task = suite.generate("substituted", 0)
    report = asyncio.run(_run_check(suite, [task], "scripted:oracle", 1, SandboxSettings(), []))
    (result,) = report.templates[0].failed
    assert result.verifier_error and result.status == "env_error"
    assert result.reason.startswith("substituted-base: ") and SUBSTITUTED in result.reason
