"""Hand a dataset snapshot to someone: a Hugging Face `datasets` directory, parquet or JSONL.

The snapshot is the parquet object recorded in its `dataset` row, checked against its
sha256 before anything is written (`training.snapshots`). Beside the data, every export
writes `epiflow_dataset.json`: the snapshot's id, kind, filter, counts, sha256 and where
it came from, so the directory says what it is without a database.

- `hf`: `datasets.Dataset.save_to_disk(DIR)`; `datasets.load_from_disk(DIR)` gives the
  rows back, columns and types as in the parquet file.
- `parquet`: the snapshot's file itself, byte for byte (`DIR/<kind>.parquet`).
- `jsonl`: one JSON object per row (`DIR/<kind>.jsonl`).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pyarrow.parquet as pq

from storage.objects import ObjectStore
from training.errors import DatasetExportError
from training.snapshots import DatasetInfo, fetch_snapshot, read_snapshot

__all__ = ["EXPORT_FORMATS", "METADATA_FILE", "export_snapshot"]

EXPORT_FORMATS = ("hf", "parquet", "jsonl")
METADATA_FILE = "epiflow_dataset.json"


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


def export_snapshot(store: ObjectStore, info: DatasetInfo, fmt: str, out: Path) -> list[Path]:
    """Write snapshot `info` as `fmt` into the new or empty directory `out`; returns the
    files written (the data first, then the metadata file).

    Raises:
        DatasetExportError: unknown format, `out` not usable.
        SnapshotError: the snapshot object is missing or does not match its sha256.
    """
    if fmt not in EXPORT_FORMATS:
        raise DatasetExportError(
            f"--format {fmt!r}: use {', '.join(EXPORT_FORMATS)}", setting="--format"
        )
    _prepare(out)
    written: list[Path]
    kind = info.kind.value
    if fmt == "parquet":
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
        json.dumps({"format": fmt, **info.model_dump(mode="json")}, indent=2, ensure_ascii=False)
        + "\n",
        encoding="utf-8",
    )
    return [*written, metadata]
