"""Under the oracle, a Harbor task fails only for the agent's reasons, never the
environment's (issue 44): the reference solution finds its files at `/solution` (where
Harbor's oracle agent uploads them), the verifier sees the workdir the agent left with its
permission bits, empty folders and symlinks (and the image's own workdir keeps them for the
agent), the verifier's `/tests` is writable and its jail has a loopback, and a solution or
verifier that needs root is refused up front (`needs-root`).

The refusal is pure (fast); the end-to-end test builds one small image (root and
mmdebstrap; `$TMPDIR/epiflow-test-images`, shared) and runs `scripted:oracle` through the
real episode loop in real jails.
"""

from __future__ import annotations

import base64
import hashlib
import random
import shutil
import tempfile
from pathlib import Path

import pytest

from suites.harbor.errors import RefusalCategory
from suites.harbor.privilege import script_root
from suites.harbor.suite import SOLUTION_CHUNK_CHARS, load_harbor_suite, oracle_steps
from suites.harbor.task import load_task
from tests.suites.test_harbor_tasks import IMAGES, _episode, _task, builds_images, needs_builder

TOML = 'version = "1.0"\n[verifier]\ntimeout_sec = 120\n[agent]\ntimeout_sec = 60\n'

# A solution file larger than one assistant answer may be (`max_output_chars`, 65,536 by
# default; Terminal-Bench's regex-chess ships a 72 KB solve.sh): the oracle writes it in
# several steps.
BIG = random.Random(44).randbytes(150_000)


@pytest.mark.parametrize(
    ("script", "found"),
    [
        ("#!/bin/bash\nset -e\nuseradd -m git || true\n", (3, "useradd")),
        ("mkdir -p /git && chown -R git:git /git\n", (1, "chown")),
        ("mkdir -p /run/sshd\n/usr/sbin/sshd\n", (2, "sshd")),
        ("sudo service nginx restart\n", (1, "service")),
        ("# chown is only mentioned\ncat > x.proto <<'EOF'\nservice KVStore {\nEOF\necho 'service ok'\n", None),
        ('python3 -c "print(1)"; echo "The service was terrible"\n', None),
    ],
)  # fmt: skip
def test_commands_that_need_root_are_found_where_a_command_starts(
    script: str, found: tuple[int, str] | None
) -> None:
    assert script_root(script) == found


def test_a_solution_file_larger_than_an_answer_is_written_in_pieces(tmp_path: Path) -> None:
    from agent.render import render_tool_call
    from agent.settings import LoopSettings

    folder = _task(
        tmp_path, "big", toml=TOML, dockerfile="FROM ubuntu:24.04\nWORKDIR /app\n",
        test_sh="echo 1 > /logs/verifier/reward.txt\n", solve="#!/bin/bash\ntrue\n",
    )  # fmt: skip
    (folder / "solution" / "big.bin").write_bytes(BIG)
    (folder / "solution" / "empty.txt").write_bytes(b"")
    steps = oracle_steps(load_task(folder), "/app")
    cap = LoopSettings().max_output_chars
    pieces: dict[str, list[bytes]] = {}
    for n, step in enumerate(steps[:-1]):
        command = step.args["command"]
        assert len(render_tool_call(f"c{n}", step.tool, step.args)) < cap
        head, body = command.split("\n", 1)
        target = head.split(" <<")[0].split("'")[-2]
        assert (">>" in head) == (target in pieces), head
        payload = body.removesuffix("\nEPIFLOW_EOF")
        assert len(payload) <= SOLUTION_CHUNK_CHARS
        pieces.setdefault(target, []).append(base64.b64decode(payload))
    assert b"".join(pieces["/solution/big.bin"]) == BIG and len(pieces["/solution/big.bin"]) == 4
    assert pieces["/solution/empty.txt"] == [b""]
    assert steps[-1].args["command"] == "cd /app && bash /solution/solve.sh"


def test_a_solution_that_needs_root_is_refused_up_front(tmp_path: Path) -> None:
    _task(
        tmp_path, "root-task", toml=TOML,
        dockerfile="FROM ubuntu:24.04\nWORKDIR /app\n",
        test_sh="echo 1 > /logs/verifier/reward.txt\n",
        solve="#!/bin/bash\nuseradd -m git\nchown -R git:git /srv\n",
    )  # fmt: skip
    _task(
        tmp_path, "plain", toml=TOML, dockerfile="FROM ubuntu:24.04\nWORKDIR /app\n",
        test_sh="echo 1 > /logs/verifier/reward.txt\n", solve="#!/bin/bash\ntrue\n",
    )  # fmt: skip
    suite = load_harbor_suite(tmp_path, name="d", images_dir=tmp_path / "images")
    (refused,) = suite.refused
    assert list(suite.templates) == ["plain"]
    assert refused.category == RefusalCategory.NEEDS_ROOT and refused.line == 2
    assert str(refused).startswith("needs-root: ") and "\n" not in str(refused)
    assert "solve.sh: line 2: the reference solution runs useradd, which needs root" in str(refused)


@pytest.mark.parametrize(
    ("test_py", "found"),
    [
        ('subprocess.run(["mkdir", "/server"], check=True)\n', "mkdir /server"),
        ('subprocess.run(["sh", "-c", "mkdir /jail; cp /app/image /jail; chroot /jail /image"])\n', "chroot /jail"),
        ('subprocess.run("cd /tmp; chroot /srv/x /bin/true", shell=True)\n', "chroot /srv/x"),
        ('subprocess.run(["mkdir", "-p", "/app/out", "/tmp/x"])\nos.makedirs("/srv")\n', None),
    ],
)  # fmt: skip
def test_a_verifier_that_needs_root_is_refused_up_front(
    tmp_path: Path, test_py: str, found: str | None
) -> None:
    task = _task(
        tmp_path, "v", toml=TOML, dockerfile="FROM ubuntu:24.04\nWORKDIR /app\n",
        test_sh="pytest /tests/test_outputs.py\n", solve="#!/bin/bash\ntrue\n",
    )  # fmt: skip
    (task / "tests" / "test_outputs.py").write_text(f"import os, subprocess\n{test_py}")
    suite = load_harbor_suite(tmp_path, name="d", images_dir=tmp_path / "images")
    if found is None:
        assert suite.refused == [] and list(suite.templates) == ["v"]
        return
    (refused,) = suite.refused
    assert refused.category == RefusalCategory.NEEDS_ROOT and refused.line == 2
    assert f"test_outputs.py: line 2: the verifier runs {found}, which needs root" in str(refused)


def test_a_verifier_that_downloads_is_refused_up_front_as_network_verifier(tmp_path: Path) -> None:
    fetching = _task(
        tmp_path, "fetching", toml=TOML, dockerfile="FROM ubuntu:24.04\nWORKDIR /app\n",
        test_sh="curl -LsSf https://astral.sh/uv/0.9.5/install.sh | sh\npytest /tests\n",
        solve="#!/bin/bash\ntrue\n",
    )  # fmt: skip
    (fetching / "tests" / "test_outputs.py").write_text(
        'import urllib.request\nURL = "https://github.com/o/r/archive/master.zip"\n'
        "urllib.request.urlretrieve(URL, '/tmp/x.zip')\n"
    )
    local = _task(
        tmp_path, "local", toml=TOML, dockerfile="FROM ubuntu:24.04\nWORKDIR /app\n",
        test_sh="curl -LsSf https://astral.sh/uv/0.9.5/install.sh | sh\npytest /tests\n",
        solve="#!/bin/bash\ntrue\n",
    )  # fmt: skip
    (local / "tests" / "test_outputs.py").write_text(
        'import requests\nrequests.get("http://localhost:8000")\nHTML = "<a href=\'https://x.org\'>"\n'
    )
    (local / "tests" / "notes.yaml").write_text("run: wget https://example.com/data\n")
    suite = load_harbor_suite(tmp_path, name="d", images_dir=tmp_path / "images")
    (refused,) = suite.refused
    assert refused.category == RefusalCategory.NETWORK_VERIFIER and refused.line == 2
    assert "test_outputs.py: line 2: the verifier downloads from github.com" in str(refused)
    assert list(suite.templates) == [
        "local"
    ]  # a URL in test data and in a non-script fetch nothing


def test_a_python_base_ships_cpythons_headers_and_verifier_packages_come_with_recommends(
    tmp_path: Path,
) -> None:
    from suites.harbor.dockerfile import parse_dockerfile
    from suites.harbor.toolkit import with_verifier_packages

    (tmp_path / "Dockerfile").write_text("FROM python:3.13-slim-bookworm\nWORKDIR /app\n")
    plan = parse_dockerfile(tmp_path / "Dockerfile", build_timeout_s=60)
    assert "python3-dev" in plan.packages
    (tmp_path / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\n")
    ubuntu = parse_dockerfile(tmp_path / "Dockerfile", build_timeout_s=60)
    assert "python3-dev" not in ubuntu.packages
    step = with_verifier_packages(ubuntu, "apt-get install -y gcc\n").steps[-1]
    assert "--no-install-recommends" not in getattr(step, "command", "")


@pytest.mark.parametrize(
    ("line", "found"),
    [
        ("model = AutoModel.from_pretrained(model_name)", "from_pretrained from the Hugging Face hub"),
        ('tok = AutoTokenizer.from_pretrained("Qwen/Qwen2.5-1.5B")', "from_pretrained from the Hugging Face hub"),
        ('ds = load_dataset("user/set", split="train")', "load_dataset from the Hugging Face hub"),
        ("huggingface-cli download gpt2", "a Hugging Face hub download"),
        ('m = AutoModel.from_pretrained("/app/model")', None),
        ('ds = load_dataset("json", data_files="/app/x.json")', None),
    ],
)  # fmt: skip
def test_a_solution_that_downloads_from_the_hugging_face_hub_needs_the_network(
    line: str, found: str | None
) -> None:
    from suites.harbor.network import script_fetch

    assert script_fetch(f"python3 - <<'EOF'\n{line}\nEOF\n") == ((2, found) if found else None)


def test_harbor_jails_have_their_own_loopback_and_the_verifier_room_for_its_requirements() -> None:
    from sandbox.host_setup import HostSetup
    from sandbox.image_jail import image_nsjail_argv
    from sandbox.image_spec import ImageMount
    from sandbox.settings import SandboxSettings
    from sandbox.spec import SandboxSpec
    from suites.harbor.suite import limits
    from suites.harbor.task import load_task
    from tasks.environment import TaskEnvironment
    from tasks.harbor_verify import offline_reason, verifier_spec

    host = HostSetup(Path("/bin/nsjail"), Path("/e"), Path("/x.py"), "rlimit", "")
    image = ImageMount(root="/images/img/root", digest="d" * 16)
    spec = SandboxSpec(image=image, network="loopback")
    argv = image_nsjail_argv(spec, host, SandboxSettings(), env={}, time_limit_s=5)
    assert "--iface_no_lo" not in argv
    closed = spec.model_copy(update={"network": "none"})
    assert "--iface_no_lo" in image_nsjail_argv(
        closed, host, SandboxSettings(), env={}, time_limit_s=5
    )
    assert "none:/solution:tmpfs" in " ".join(argv)

    root = Path(tempfile.mkdtemp())
    try:
        toml = TOML.replace("[agent]", '[environment]\nmemory = "2G"\n[agent]')
        task = load_task(
            _task(root, "t", toml=toml, dockerfile="FROM ubuntu:24.04\n", test_sh="true\n")
        )
        spec_limits, _ = limits(task)
        assert spec_limits["network"] == "loopback"
        env = TaskEnvironment(image=image, limits=spec_limits, tests_dir="/t", toolkit_dir="/k")
        agent = env.sandbox_spec(SandboxSpec())
        verifier = verifier_spec(env, agent)
        assert (agent.tmpfs_mib, agent.workspace_mib) == (256, 1024)
        assert verifier.tmpfs_mib == 2048 - 1024 - 128 and verifier.network == "loopback"
    finally:
        shutil.rmtree(root, ignore_errors=True)
    full = "uvx -p 3.13 pytest: error: Failed to install: torch (No space left on device)\n"
    assert offline_reason(full).startswith("the verifier's requirements do not fit its jail's")


SOLVE = """\
#!/bin/bash
set -e
cp /solution/answer.txt /app/answer.txt
cp /solution/big.bin /app/big.bin
mkdir -p /app/keys /app/repo/refs/heads /app/repo/refs/tags
printf secret > /app/keys/server.key
chmod 600 /app/keys/server.key
ln -s answer.txt /app/latest
"""
TEST_SH = """\
#!/bin/bash
ok=1
[ "$(cat /app/answer.txt)" = 42 ] || { echo "answer: no /solution/answer.txt"; ok=0; }
[ "$(sha256sum < /app/big.bin | cut -d' ' -f1)" = "$BIG_SHA256" ] || { echo "big.bin differs"; ok=0; }
[ "$(stat -c %a /app/keys/server.key)" = 600 ] || { echo "key mode lost"; ok=0; }
[ -d /app/repo/refs/tags ] || { echo "empty folder lost"; ok=0; }
[ "$(readlink /app/latest)" = answer.txt ] || { echo "symlink lost"; ok=0; }
[ "$(/app/tool.sh)" = tool ] || { echo "the image's executable lost its mode"; ok=0; }
echo built > /tests/built || { echo "/tests is not writable"; ok=0; }
python3 -c "import socket; s = socket.create_server(('127.0.0.1', 0)); socket.create_connection(s.getsockname())" || { echo "no loopback"; ok=0; }
echo $ok > /logs/verifier/reward.txt
"""


@pytest.fixture(scope="module")
def oracle_episode():
    root = Path(tempfile.mkdtemp(dir=IMAGES.parent))
    root.chmod(0o755)
    try:
        task = _task(
            root, "shaped", toml=TOML,
            dockerfile=(
                "FROM ubuntu:24.04\nWORKDIR /app\nCOPY tool.sh /app/tool.sh\n"
                "RUN chmod 755 /app/tool.sh\n"
            ),
            test_sh=TEST_SH.replace("$BIG_SHA256", hashlib.sha256(BIG).hexdigest()), solve=SOLVE,
        )  # fmt: skip
        (task / "environment" / "tool.sh").write_text("#!/bin/sh\necho tool\n")
        (task / "environment" / "tool.sh").chmod(0o644)
        (task / "solution" / "answer.txt").write_text("42\n")
        (task / "solution" / "answer.txt").chmod(0o644)
        (task / "solution" / "big.bin").write_bytes(BIG)
        (task / "solution" / "big.bin").chmod(0o644)
        IMAGES.mkdir(exist_ok=True)
        suite = load_harbor_suite(root, name="oracle-env", images_dir=IMAGES)
        yield _episode(suite.generate("shaped", 0), "scripted:oracle")
    finally:
        shutil.rmtree(root, ignore_errors=True)


@needs_builder
@builds_images
def test_the_oracle_reads_solution_and_the_verifier_sees_the_workdirs_shape(
    oracle_episode,
) -> None:
    from agent.trajectory import EpisodeStatus

    traj = oracle_episode
    assert traj.status == EpisodeStatus.SUCCESS and traj.verifier_score == 1.0, (
        traj.failure_reason,
        traj.verifier_reason,
        traj.verifier_details,
    )
