"""Hand a dataset snapshot to someone: a Hugging Face `datasets` directory, parquet or JSONL.

The snapshot is the parquet object recorded in its `dataset` row, checked against its
sha256 before anything is written (`training.snapshots`). Beside the data, every export
writes `epiflow_dataset.json`: the snapshot's id, kind, filter, counts, sha256 and where
it came from, so the directory says what it is without a database.

- `hf`: `datasets.Dataset.save_to_disk(DIR)`; `datasets.load_from_disk(DIR)` gives the
  rows back, columns and types as in the parquet file.
- `parquet`: the snapshot's file itself, byte for byte (`DIR/<kind>.parquet`).
- `jsonl`: one JSON object per row (`DIR/<kind>.jsonl`).

Chat snapshots (`sft`, `distill`) export in one of two message forms:

- `text` (default): the chat exactly as the model saw it, the XML protocol inside
  `content`, observations as `user` turns (what epiflow trains on).
- `tool-calls`: TRL's tool-calling form (`training.conversations.tool_calling_messages`):
  assistant `tool_calls` with JSON-object arguments, `tool` messages with `tool_call_id`,
  and a `tools` column: the list of the tools' JSON schemas, which TRL's `SFTTrainer`
  passes to the chat template. The `hf` dataset stores messages with `datasets.Json`
  features (`on_mixed_types="use_json"`), so arguments of different tools keep exactly
  their own keys instead of Arrow filling the others with nulls. `hf` and `jsonl` only:
  `parquet` is the snapshot's own bytes.

`weight` (the quality score) is a column like any other. epiflow's SFT trainer samples
rows in proportion to it; plain TRL ignores it, so a user who trains elsewhere should
sample by it (e.g. `torch.utils.data.WeightedRandomSampler`) or filter on it.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from storage.objects import ObjectStore
from training.builders import DatasetKind
from training.errors import DatasetExportError
from training.snapshots import DatasetInfo, fetch_snapshot, read_snapshot

__all__ = ["EXPORT_FORMATS", "MESSAGE_FORMS", "METADATA_FILE", "export_snapshot"]

EXPORT_FORMATS = ("hf", "parquet", "jsonl")
MESSAGE_FORMS = ("text", "tool-calls")
METADATA_FILE = "epiflow_dataset.json"
_CHAT_KINDS = (DatasetKind.SFT, DatasetKind.DISTILL)


def _prepare(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise DatasetExportError(f"--out {out} is a file, not a directory", setting="--out")
    if out.exists() and any(out.iterdir()):
        raise DatasetExportError(
            f"--out {out} is not empty: export into a new or empty directory", setting="--out"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DatasetExportError(
            f"cannot create --out {out}: {e.strerror or e}", setting="--out"
        ) from e


def _tool_calling_rows(store: ObjectStore, info: DatasetInfo) -> list[dict[str, Any]]:
    from sandbox.tool_specs import BUILTIN_TOOLS
    from training.conversations import tool_calling_messages

    every_tool = json.dumps([t.openai_tool() for t in BUILTIN_TOOLS.values()])
    rows = read_snapshot(store, info).to_dicts()
    for row in rows:
        # Snapshots built before the `tools` column offered every built-in tool.
        tools = row.get("tools") or every_tool
        row["tools"] = json.loads(tools)
        try:
            row["messages"] = tool_calling_messages(row["messages"], tools)
        except ValueError as e:
            raise DatasetExportError(
                f"snapshot {info.id}, episode {row.get('episode_id')}: {e}", setting="--messages"
            ) from e
    return rows


def export_snapshot(
    store: ObjectStore, info: DatasetInfo, fmt: str, out: Path, *, messages: str = "text"
) -> list[Path]:
    """Write snapshot `info` as `fmt` into the new or empty directory `out`, chats in the
    `messages` form (`text` or `tool-calls`); returns the files written (the data first,
    then the metadata file).

    Raises:
        DatasetExportError: unknown format or message form, a form the kind or format
            cannot take, `out` not usable.
        SnapshotError: the snapshot object is missing or does not match its sha256.
    """
    if fmt not in EXPORT_FORMATS:
        raise DatasetExportError(
            f"--format {fmt!r}: use {', '.join(EXPORT_FORMATS)}", setting="--format"
        )
    if messages not in MESSAGE_FORMS:
        raise DatasetExportError(
            f"--messages {messages!r}: use {', '.join(MESSAGE_FORMS)}", setting="--messages"
        )
    tool_calls = messages == "tool-calls"
    if tool_calls and info.kind not in _CHAT_KINDS:
        raise DatasetExportError(
            f"--messages tool-calls needs a chat snapshot (sft or distill); "
            f"{info.id} is {info.kind.value}",
            setting="--messages",
        )
    if tool_calls and fmt == "parquet":
        raise DatasetExportError(
            "--messages tool-calls: use --format hf or jsonl (parquet is the snapshot's own "
            "file, in the text form)",
            setting="--messages",
        )
    _prepare(out)
    written: list[Path]
    kind = info.kind.value
    if tool_calls:
        rows = _tool_calling_rows(store, info)
        if fmt == "jsonl":
            target = out / f"{kind}.jsonl"
            with target.open("w", encoding="utf-8") as f:
                for row in rows:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
            written = [target]
        else:
            import datasets

            description = (
                f"epiflow {kind} snapshot {info.id} (sha256 {info.sha256}), tool-calling form"
            )
            dataset = datasets.Dataset.from_list(
                rows,
                info=datasets.DatasetInfo(description=description),
                on_mixed_types="use_json",
            )
            dataset.save_to_disk(str(out))
            written = sorted(p for p in out.iterdir() if p.is_file())
    elif fmt == "parquet":
        written = [fetch_snapshot(store, info, out / f"{kind}.parquet")]
    elif fmt == "jsonl":
        target = out / f"{kind}.jsonl"
        read_snapshot(store, info).write_ndjson(target)
        written = [target]
    else:
        import datasets

        with tempfile.TemporaryDirectory(prefix="epiflow-dataset-") as tmp:
            # The snapshot's own file (sha256-checked), read by Arrow as it was written.
            table = pq.read_table(fetch_snapshot(store, info, Path(tmp) / "snapshot.parquet"))
        description = f"epiflow {kind} snapshot {info.id} (sha256 {info.sha256})"
        dataset = datasets.Dataset(table, info=datasets.DatasetInfo(description=description))
        dataset.save_to_disk(str(out))
        written = sorted(p for p in out.iterdir() if p.is_file())
    metadata = out / METADATA_FILE
    metadata.write_text(
        json.dumps(
            {"format": fmt, "messages": messages, **info.model_dump(mode="json")},
            indent=2,
            ensure_ascii=False,
        )
        + "\n",
        encoding="utf-8",
    )
    return [*written, metadata]
