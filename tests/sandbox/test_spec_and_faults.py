"""Pure logic: spec validation and hashing, fault decisions, nsjail argv, safe paths."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sandbox import FaultProfile, SandboxSettings, SandboxSpec
from sandbox.faults import FaultInjector
from sandbox.host_setup import HostSetup
from sandbox.nsjail import SECCOMP_POLICY, jail_env, nsjail_argv
from sandbox.transfer import TransferError, safe_relative


def test_spec_defaults_follow_the_seeds() -> None:
    spec = SandboxSpec()
    assert (spec.cpus, spec.memory_mib, spec.network) == (2, 4096, "none")
    assert (spec.call_timeout_s, spec.soft_timeout_s, spec.hard_timeout_s) == (30, 480, 600)


@pytest.mark.parametrize(
    "fields",
    [
        {"memory_mib": 0},
        {"cpus": 0},
        {"network": "host"},
        {"soft_timeout_s": 600, "hard_timeout_s": 600},
        {"call_timeout_s": 400},
        {"memory_mib": 512, "workspace_mib": 512},
        {"env_allow": ("BAD-NAME",)},
        {"env": {"X": "a\x00b"}},
        {"unknown_field": 1},
    ],
)
def test_spec_rejects_bad_values(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        SandboxSpec(**fields)


def test_spec_hash_is_stable_and_sensitive() -> None:
    a = SandboxSpec(env={"B": "1", "A": "2"}, env_allow=("Y", "X"))
    b = SandboxSpec(env_allow=("X", "Y"), env={"A": "2", "B": "1"})
    assert a.spec_hash() == b.spec_hash() and len(a.spec_hash()) == 64
    assert SandboxSpec().spec_hash() != SandboxSpec(memory_mib=2048).spec_hash()
    assert SandboxSpec.model_validate_json(a.canonical_json()) == a
    assert hash(a) == hash(b)


def test_call_timeout_is_clamped() -> None:
    spec = SandboxSpec(call_timeout_s=5, max_call_timeout_s=20)
    assert (spec.call_timeout(None), spec.call_timeout(3), spec.call_timeout(999)) == (5, 3, 20)


def test_fault_profile_validation() -> None:
    assert not FaultProfile().enabled
    with pytest.raises(ValidationError):
        FaultProfile(latency_p=0.6, permission_denied_p=0.6)
    with pytest.raises(ValidationError):
        FaultProfile(latency_ms=(2000, 1000))
    with pytest.raises(ValidationError):
        FaultProfile(tool_timeout_p=1.5)


def test_fault_decisions_depend_only_on_seed_and_call_index() -> None:
    profile = FaultProfile(
        latency_p=0.25, permission_denied_p=0.25, network_failure_p=0.25, tool_timeout_p=0.25
    )
    a, b = FaultInjector(profile, 3), FaultInjector(profile, 3)
    seq_a = [a.next_fault("execute_shell") for _ in range(50)]
    seq_b = [b.next_fault("execute_shell") for _ in range(50)]
    assert seq_a == seq_b
    assert {f.kind for f in seq_a if f} == {
        "latency",
        "permission_denied",
        "network_failure",
        "tool_timeout",
    }
    for fault in seq_a:
        assert fault is not None  # probabilities sum to 1
        if fault.kind == "latency":
            assert 1000 <= fault.detail["latency_ms"] <= 2000
    assert [
        f for f in (FaultInjector(profile, 4).next_fault("execute_shell") for _ in range(50))
    ] != seq_a
    never = FaultInjector(FaultProfile(network_failure_p=1.0), 0)
    assert never.next_fault("read_file") is None  # file tools have no network to fail


def _host(mode: str) -> HostSetup:
    from pathlib import Path

    return HostSetup(Path("/bin/nsjail"), Path("/state/etc"), Path("/pkg/exec.py"), mode, "")  # type: ignore[arg-type]


def test_argv_follows_the_spec() -> None:
    settings = SandboxSettings(toolchain_paths=("/usr",))
    spec = SandboxSpec(cpus=1, memory_mib=1024, pids=99, network="none")
    argv = nsjail_argv(spec, _host("cgroup_v1"), settings, command=["/bin/true"], time_limit_s=10)
    joined = " ".join(argv)
    assert argv[-2:] == ["--", "/bin/true"]
    assert "--cgroup_mem_max 1073741824" in joined and "--cgroup_pids_max 99" in joined
    assert "--iface_no_lo" in argv and "--bindmount_ro /usr" in joined
    assert "--bindmount_ro /state/etc:/etc" in joined
    assert f"--user 1000:{settings.outside_uid}:1" in joined
    assert "--seccomp_string" in argv and "ptrace" in SECCOMP_POLICY and "clone3" in SECCOMP_POLICY
    assert "--keep_env" not in argv and "--disable_clone_newnet" not in argv
    loop = nsjail_argv(
        spec.model_copy(update={"network": "loopback"}),
        _host("rlimit"),
        settings,
        command=["x"],
        time_limit_s=1,
    )
    assert "--iface_no_lo" not in loop and "--cgroup_mem_max" not in loop
    assert "--rlimit_as 1024" in " ".join(loop) and "--rlimit_nproc 99" in " ".join(loop)


def test_jail_env_passes_only_the_allow_list() -> None:
    spec = SandboxSpec(env_allow=("KEEP",), env={"EXTRA": "1"})
    env = jail_env(spec, {"KEEP": "yes", "SECRET": "no", "PATH": "/host/bin"})
    assert env["KEEP"] == "yes" and env["EXTRA"] == "1" and "SECRET" not in env
    assert env["PATH"] != "/host/bin"


@pytest.mark.parametrize("bad", ["", "/abs", "../x", "a/../b", "a/..", "..", "a/\x00"])
def test_safe_relative_rejects(bad: str) -> None:
    with pytest.raises(TransferError):
        safe_relative(bad)


def test_safe_relative_normalizes_harmless_forms() -> None:
    assert [str(safe_relative(p)) for p in ("a/b.txt", "a//b", "./a")] == ["a/b.txt", "a/b", "a"]
