"""A Harbor dataset (a folder of task directories) as an epiflow `Suite`.

Each task directory is a static template: the same task for every seed (the seed still
goes into the task id), named after the task, versioned `<task version>+<content hash>`
so that any change to the directory changes the task id. The instance's prompt is
`instruction.md`; its environment (`TaskEnvironment`) is the image built from
`environment/Dockerfile` (on first use: listing a dataset builds nothing), the task's
limits, `tests/` and the offline verifier toolkit; its reference solution (the
`scripted:oracle` policy) is `solution/solve.sh`, run through the agent's own
`execute_shell` tool: the solution files written to `/solution` first (where Harbor's own
oracle agent uploads them: some solutions read their files from there), one step each,
then `bash /solution/solve.sh` in the workdir.

A dataset is a list of tasks, each with its own outcome: a task that cannot run here is
refused at load (`RefusedTask`, one line with its category) and the others load; a task
whose image does not build gets an environment with `build_error`, so its episodes are
`env_error` while the others run. `strict` makes the dataset all or nothing.
"""

from __future__ import annotations

import base64
import threading
from pathlib import Path
from typing import Any

from core.errors import reason_line
from sandbox.image_spec import ImageMount
from sandbox.images import ImageBuildError, ImagePlan, ensure_image
from suites.errors import SuiteError
from suites.harbor.dockerfile import parse_dockerfile
from suites.harbor.errors import HarborTaskError, RefusalCategory, RefusedTask
from suites.harbor.privilege import verifier_root
from suites.harbor.task import HarborTask, is_task_dir, load_task
from suites.harbor.toolkit import ensure_toolkit, verifier_requirements, with_verifier_packages
from suites.suite import Suite
from suites.template import TaskDraft, TaskTemplate, call
from tasks.environment import TaskEnvironment
from tasks.harbor_reward import DEFAULT_RULE
from tasks.types import ReferenceCall, TaskInstance, VerifierSpec

TMPFS_MIB = 256
SOLUTION_DIR = "/solution"
"""Where Harbor's oracle agent uploads `solution/` (`EnvironmentPaths.solution_dir`); a
writable tmpfs in every image jail (`ImageMount.writable`)."""
SOLUTION_CHUNK_CHARS = 60_000
"""Base64 characters of a solution file written per oracle step (a multiple of 4). A step is
one assistant answer, which the loop caps (`LoopSettings.max_output_chars`, 65,536 by
default): a larger file (Terminal-Bench's regex-chess ships a 72 KB `solve.sh`) is written
in several steps rather than cut."""


class HarborDatasetError(SuiteError):
    """Strict mode: a Harbor dataset holds tasks that cannot run; every one is listed."""

    def __init__(self, folder: Path, refused: list[RefusedTask]) -> None:
        self.refused = refused
        lines = "\n".join(f"  {r}" for r in refused)
        super().__init__(
            f"Harbor dataset {folder}: {len(refused)} task(s) cannot run and "
            f"EPIFLOW_SUITES_HARBOR_STRICT is set (unset it to run the others):\n{lines}",
            setting="EPIFLOW_SUITES_HARBOR_STRICT",
        )


def is_dataset(folder: Path) -> bool:
    """True when `folder` is a task directory or holds at least one."""
    if is_task_dir(folder):
        return True
    return folder.is_dir() and any(is_task_dir(p) for p in folder.iterdir() if p.is_dir())


def task_dirs(folder: Path) -> list[Path]:
    if is_task_dir(folder):
        return [folder]
    return sorted(p for p in folder.iterdir() if p.is_dir() and is_task_dir(p))


def limits(task: HarborTask) -> tuple[dict[str, Any], list[str]]:
    """The `SandboxSpec` fields a task sets, and what was adapted to fit a jail."""
    workspace = min(task.storage_mib, task.memory_mib // 2)
    tmpfs = min(TMPFS_MIB, task.memory_mib // 8)
    hard = task.agent_timeout_s
    notes = [
        f"storage {task.storage_mib} MiB → a {workspace} MiB workdir tmpfs (RAM-backed, at most "
        "half the memory)"
    ] if workspace < task.storage_mib else []  # fmt: skip
    return {
        "cpus": task.cpus,
        "memory_mib": task.memory_mib,
        "workspace_mib": workspace,
        "tmpfs_mib": tmpfs,
        "hard_timeout_s": hard,
        "soft_timeout_s": hard * 0.9,
        "max_call_timeout_s": max(300.0, hard),
        # A container has its own loopback (servers the task or its tests start on
        # localhost); the jail's is private to it, never the host's.
        "network": "loopback",
    }, notes


def oracle_steps(task: HarborTask, workdir: str) -> list[ReferenceCall]:
    """`solution/` through `execute_shell`: each file written under /solution (in pieces of
    at most `SOLUTION_CHUNK_CHARS` of base64 a step), then solve.sh."""
    if task.solve_script is None:
        return []
    folder = task.path / "solution"
    steps: list[ReferenceCall] = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        encoded = base64.b64encode(path.read_bytes()).decode()
        target = f"{SOLUTION_DIR}/{rel}"
        # Each piece is a whole number of base64 quanta, so it decodes on its own; the first
        # creates the file, the others append.
        pieces = [
            encoded[i : i + SOLUTION_CHUNK_CHARS]
            for i in range(0, len(encoded), SOLUTION_CHUNK_CHARS)
        ] or [""]
        for n, piece in enumerate(pieces):
            write = (
                f"mkdir -p \"$(dirname '{target}')\" && base64 -d > '{target}'"
                if n == 0
                else f"base64 -d >> '{target}'"
            )
            steps.append(
                call("execute_shell", command=f"{write} <<'EPIFLOW_EOF'\n{piece}\nEPIFLOW_EOF")
            )
    timeout = int(min(task.agent_timeout_s, 3600))
    steps.append(
        call(
            "execute_shell",
            command=f"cd {workdir} && bash {SOLUTION_DIR}/solve.sh",
            timeout=timeout,
        )
    )
    return steps


def refuse_verifier_root(task: HarborTask, workdir: str) -> None:
    """Refuse (`needs-root`) a task whose verifier needs root in its jail
    (`suites.harbor.privilege.verifier_root`).

    Raises:
        HarborTaskError: it does.
    """
    writable = (*ImageMount.model_fields["writable"].default, "/logs", workdir)
    found = verifier_root(task.tests_dir, writable)
    if found is not None:
        file, line, what = found
        raise HarborTaskError(
            file,
            f"line {line}",
            f"the verifier runs {what}, which needs root: Harbor runs tests/ as root in the "
            "task's container, epiflow's verifier is an unprivileged user in the read-only "
            f"image (writable: {', '.join(writable)})",
            category=RefusalCategory.NEEDS_ROOT,
            line=line,
        )


class HarborSuite(Suite):
    """A Harbor dataset; instances carry their built environment."""

    def __init__(
        self,
        name: str,
        tasks: list[HarborTask],
        *,
        images_dir: Path,
        source: Path,
        plans: dict[str, ImagePlan],
        refused: list[RefusedTask] | None = None,
        reward_rule: str = DEFAULT_RULE,
    ) -> None:
        self.tasks = {t.name: t for t in tasks}
        self.images_dir = images_dir
        self.reward_rule = reward_rule
        """How named rewards combine into the score (`tasks/harbor_reward.py`)."""
        self.refused = refused or []
        """Tasks left out at load, one line each (`RefusedTask`: path, line, category)."""
        self.plans = plans
        self._environments: dict[str, TaskEnvironment] = {}
        self._build_failures: dict[str, ImageBuildError] = {}
        self._lock = threading.Lock()
        templates = [self._template(t) for t in tasks]
        super().__init__(
            name, "1", templates, description=f"Harbor dataset {source}", source=source
        )

    def _template(self, task: HarborTask) -> TaskTemplate:
        workdir = self.plans[task.name].workdir
        draft = TaskDraft(
            prompt=task.instruction,
            reference_solution=oracle_steps(task, workdir),
            reference_final="Done.",
            verifier=VerifierSpec(
                argv=["bash", "/tests/test.sh"], timeout_s=task.verifier_timeout_s
            ),
        )
        first = next(
            (line.strip("# ").strip() for line in task.instruction.splitlines() if line.strip()), ""
        )
        return TaskTemplate(
            name=task.name,
            version=f"{task.version}+{task.content_hash[:10]}",
            difficulty=task.difficulty,
            summary=f"{first} (harbor: {task.difficulty_label or '-'}, {task.category or '-'})"[
                :120
            ],
            build=lambda _rng: draft,
        )

    def environment(self, name: str) -> TaskEnvironment:
        """The task's environment, its image built (once per process; once per digest on disk).

        Raises:
            ImageBuildError: the image or the toolkit could not be built (again: a failure is
                kept for the process, so a task's instances do not each build it again).
        """
        with self._lock:
            if name in self._environments:
                return self._environments[name]
            if name in self._build_failures:
                raise self._build_failures[name]
            try:
                env = self._build(name)
            except ImageBuildError as e:
                self._build_failures[name] = e
                raise
            self._environments[name] = env
            return env

    def _build(self, name: str) -> TaskEnvironment:
        task, plan = self.tasks[name], self.plans[name]
        test_sh = (task.tests_dir / "test.sh").read_text(errors="replace")
        plan = with_verifier_packages(plan, test_sh)
        built = ensure_image(plan, self.images_dir, timeout_s=task.build_timeout_s)
        python = "3.13" if plan.release == "trixie" else "3.11"
        requirements = verifier_requirements(test_sh)
        toolkit = ensure_toolkit(self.images_dir, requirements, python)
        spec_limits, notes = limits(task)
        substitutions = [*built.substitutions, *notes]
        if task.docker_image:
            substitutions.append(
                f"docker_image {task.docker_image} not pulled: built from the Dockerfile"
            )
        env = TaskEnvironment(
            image=ImageMount(root=built.root, digest=built.digest, workdir=plan.workdir, env=plan.env),
            limits=spec_limits,
            tests_dir=str(task.tests_dir.resolve()),
            toolkit_dir=str(toolkit),
            verifier_timeout_s=task.verifier_timeout_s,
            reward_rule=self.reward_rule,
            substitutions=tuple(substitutions),
            base_substitution=plan.base_substitution,
            metadata={
                "task": task.name, "version": task.version, "content_hash": task.content_hash,
                "difficulty": task.difficulty_label, "category": task.category,
                "tags": list(task.tags), "source": str(task.path),
            },
            build_s=round(built.build_s, 3),
        )  # fmt: skip
        return env

    def unbuilt_environment(self, name: str, error: ImageBuildError) -> TaskEnvironment:
        """The environment of a task whose image could not be built: its episodes end as
        `env_error` naming `error` before any jail opens (a re-run builds again)."""
        task, plan = self.tasks[name], self.plans[name]
        digest = plan.digest()
        spec_limits, _ = limits(task)
        return TaskEnvironment(
            image=ImageMount(
                root=str(self.images_dir / f"img-{digest[:24]}" / "root"), digest=digest,
                workdir=plan.workdir, env=plan.env,
            ),
            limits=spec_limits, tests_dir=str(task.tests_dir.resolve()), toolkit_dir="",
            verifier_timeout_s=task.verifier_timeout_s, substitutions=plan.substitutions,
            base_substitution=plan.base_substitution,
            metadata={"task": task.name, "version": task.version, "source": str(task.path)},
            build_error=reason_line(str(error), 500),
        )  # fmt: skip

    def _instance(self, tmpl: TaskTemplate, seed: int, draft: TaskDraft) -> TaskInstance:
        instance = super()._instance(tmpl, seed, draft)
        try:
            env = self.environment(tmpl.name)
        except ImageBuildError as e:  # this task's infrastructure outcome, not the dataset's
            env = self.unbuilt_environment(tmpl.name, e)
        return instance.model_copy(update={"environment": env})


def load_harbor_suite(
    folder: Path,
    *,
    name: str,
    images_dir: Path,
    strict: bool = False,
    reward_rule: str = DEFAULT_RULE,
) -> HarborSuite:
    """The Harbor dataset at `folder` (a task directory or a folder of them): every task
    that can run here, and one `RefusedTask` for each that cannot (`suite.refused`).

    Loading never fails because of a task: a task whose files are unreadable or malformed,
    or that cannot run here, is refused with its category; a dataset with none runnable is
    a suite with no templates.

    Raises:
        HarborDatasetError: `strict` is on and some task is refused (every one listed).
    """
    tasks: list[HarborTask] = []
    plans: dict[str, ImagePlan] = {}
    refused: list[RefusedTask] = []
    for path in task_dirs(folder):
        try:
            task = load_task(path)
            plan = parse_dockerfile(task.dockerfile, build_timeout_s=task.build_timeout_s)
            refuse_verifier_root(task, plan.workdir)
        except HarborTaskError as e:
            refused.append(RefusedTask.from_error(path, e))
            continue
        except (OSError, UnicodeError) as e:  # a file that cannot be read (e.g. its permissions)
            refused.append(
                RefusedTask.from_error(
                    path, HarborTaskError(path, "<file>", f"cannot be read: {e}")
                )
            )
            continue
        if task.name in plans:
            refused.append(RefusedTask.from_error(path, HarborTaskError(
                path / "task.toml", "task.name", f"{task.name!r} is also the name of another task",
            )))  # fmt: skip
            continue
        tasks.append(task)
        plans[task.name] = plan
    if refused and strict:
        raise HarborDatasetError(folder, refused)
    return HarborSuite(
        name,
        tasks,
        images_dir=images_dir,
        source=folder,
        plans=plans,
        refused=refused,
        reward_rule=reward_rule,
    )
