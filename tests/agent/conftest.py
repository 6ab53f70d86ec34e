"""Fixtures of the agent tests: a small task, loop settings, the in-memory sandbox double.

Async code runs through `asyncio.run` inside plain test functions (no asyncio plugin).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent.settings import LoopSettings
from sandbox.interface import Sandbox
from sandbox.spec import SandboxSpec
from tasks.types import ReferenceCall, TaskInstance, VerifierSpec
from tasks.verify import VerifierOutcome
from tests.agent.doubles import MemorySandbox

VERIFY_SCRIPT = """\
import json, pathlib
p = pathlib.Path("/workspace/out.txt")
ok = p.is_file() and p.read_text() == "HELLO\\n"
print(json.dumps({"score": 1.0 if ok else 0.0, "reason": "out.txt ok" if ok else "out.txt missing or wrong"}))
"""


def make_copy_task(seed: int = 0) -> TaskInstance:
    """Read data/in.txt, write its upper-cased content to out.txt (verifier runs in the jail)."""
    return TaskInstance(
        suite="agent-tests",
        suite_version="1",
        template="upper_copy",
        template_version="1",
        seed=seed,
        difficulty=1,
        prompt="Write the content of data/in.txt, upper-cased, to out.txt in /workspace.",
        files={"data/in.txt": "hello\n"},
        reference_solution=[
            ReferenceCall(tool="list_dir", args={"path": "data"}),
            ReferenceCall(tool="read_file", args={"path": "data/in.txt"}),
            ReferenceCall(tool="execute_shell", args={"command": "cat data/in.txt", "timeout": 10}),
            ReferenceCall(tool="write_file", args={"path": "out.txt", "content": "HELLO\n"}),
        ],
        reference_final="out.txt now holds HELLO.",
        verifier=VerifierSpec(argv=["python3", "-I", "-c", VERIFY_SCRIPT], timeout_s=20),
    )


@pytest.fixture
def task() -> TaskInstance:
    return make_copy_task()


@pytest.fixture
def spec() -> SandboxSpec:
    return SandboxSpec(
        memory_mib=512, pids=64, tmpfs_mib=32, workspace_mib=64, inodes=4096, call_timeout_s=10
    )


@pytest.fixture
def loop_settings() -> LoopSettings:
    return LoopSettings(max_steps=12)


async def memory_verify(sandbox: Sandbox, task: TaskInstance) -> VerifierOutcome:
    """Verifier for the double: the same check as VERIFY_SCRIPT, on the in-memory files."""
    assert isinstance(sandbox, MemorySandbox)
    ok = sandbox.files.get("out.txt") == b"HELLO\n"
    return VerifierOutcome(
        score=1.0 if ok else 0.0, reason="out.txt ok" if ok else "out.txt missing or wrong"
    )


class MemoryOpener:
    """`open_sandbox` stand-in that builds `MemorySandbox` doubles and remembers them."""

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.opened: list[MemorySandbox] = []

    async def __call__(
        self, spec: SandboxSpec, *, files: Any = None, faults: Any = None, fault_seed: int = 0
    ) -> Sandbox:
        box = MemorySandbox(files, **self.options)
        self.opened.append(box)
        return box


@pytest.fixture
def memory_opener() -> Callable[..., MemoryOpener]:
    return MemoryOpener


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny, randomly initialised Qwen2 checkpoint built here (no downloads): a byte-level
    BPE trained on a few protocol strings, TRL's `qwen2_5.jinja` chat template."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    trl = pytest.importorskip("trl")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    template = Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja"
    if not template.is_file():
        pytest.skip(f"TRL ships no {template.name} in this version")
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    corpus = [
        '<tool_call id="c1" name="read_file">\n<arg name="path">data/in.txt</arg>\n</tool_call>',
        "<final>done</final> system user assistant tool You are an agent working inside a sandbox.",
    ] * 20
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
    )
    fast.chat_template = template.read_text()
    path = tmp_path_factory.mktemp("tiny-qwen2")
    fast.save_pretrained(path)
    config = transformers.Qwen2Config(
        vocab_size=len(fast),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16384,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
    )
    torch.manual_seed(0)
    transformers.Qwen2ForCausalLM(config).save_pretrained(path)
    return path
