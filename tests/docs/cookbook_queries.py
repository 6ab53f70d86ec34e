"""The queries of docs/sql-cookbook.md: each block marked `<!-- query: name -->` with the
columns its `Columns:` line lists (read by the cookbook test and `bench/sql_scale.py`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "sql-cookbook.md"
BLOCK = re.compile(
    r"<!-- query: (?P<name>\w+)(?: \((?P<data>\w+)\))? -->\n```sql\n(?P<sql>.*?)\n```\n", re.S
)
PARAM = re.compile(r"(?<![:\w]):(?P<name>[a-z_]\w*)")
FORBIDDEN = ("::", " ILIKE ", "FILTER (", "PERCENTILE_", "DISTINCT ON", "->>", "NOW()")


@dataclass(frozen=True)
class CookbookQuery:
    name: str
    sql: str
    columns: list[str]
    data: str = "collection"
    """What the query needs in the database: `collection` (the cookbook test's collection,
    gate, snapshots and training) or `imports` (Harbor's linked ATIF files imported)."""

    @property
    def params(self) -> set[str]:
        return {m["name"] for m in PARAM.finditer(self.sql)}


def load_queries() -> list[CookbookQuery]:
    doc = DOC.read_text(encoding="utf-8")
    matches = list(BLOCK.finditer(doc))
    queries = []
    for i, m in enumerate(matches):
        tail = doc[m.end() : matches[i + 1].start() if i + 1 < len(matches) else len(doc)]
        listed = re.search(r"^Columns: (.+)$", tail, re.M)
        columns = re.findall(r"`(\w+)`", listed.group(1)) if listed else []
        queries.append(CookbookQuery(m["name"], m["sql"], columns, m["data"] or "collection"))
    return queries
