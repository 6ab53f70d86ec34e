"""The collection benchmark's floor: the recorded executor requests replayed on the host.

    python -I -S bench/collect_floor.py RECORDING.json   (run by bench/collect_throughput.py)

RECORDING holds what every episode jail of a real collection was asked, request by request
(workspace population, each tool call, the verifier, exports), with the executor's
configuration and the concurrency. This script starts, per episode, the same in-jail
executor (`sandbox/jail_executor.py`, the same interpreter and flags) directly on the host
with a fresh temporary directory as its workspace (no nsjail), sends it the same frames
(`/workspace` rewritten to that directory), and ends it: no policy, no Prefect, no SQL, no
object store, no trajectory objects. It is a small separate process (stdlib only, `-I -S`)
so that its process starts do not pay for a large parent's address space. It prints one
JSON object: `floor_s`, `episodes`, `requests`, and `mismatched` (answers whose outcome —
`ok`, `exit_code`, `timed_out` — differs from the one the jail gave; 0 when the replay did
what the collection did).
"""

import json
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

OUTCOME = ("ok", "exit_code", "timed_out")


def _read_exact(stream: Any, n: int) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise RuntimeError("the executor closed its channel")
    return bytes(data)


def _frame(stream: Any) -> dict[str, Any]:
    size = int.from_bytes(_read_exact(stream, 4), "big")
    value = json.loads(_read_exact(stream, size))
    if not isinstance(value, dict):
        raise RuntimeError("the executor sent a non-object frame")
    return value


def replay(
    python: str, executor: str, config: dict[str, Any], requests: list[dict[str, Any]]
) -> int:
    """One episode: a host executor in a fresh workspace, the recorded requests, its end.
    Returns how many answers differ in outcome from the recorded ones."""
    root = tempfile.mkdtemp(prefix="epiflow-floor-")
    try:
        own = json.dumps({**config, "workspace": root})
        proc = subprocess.Popen(
            [python, "-I", "-S", "-B", executor, own],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=root,
        )
        assert proc.stdin is not None and proc.stdout is not None
        mismatched = 0
        try:
            _frame(proc.stdout)  # ready
            for item in requests:
                body = json.dumps(item["payload"], separators=(",", ":"))
                data = body.replace("/workspace", root).encode("ascii")
                proc.stdin.write(len(data).to_bytes(4, "big") + data)
                proc.stdin.flush()
                answer = _frame(proc.stdout)
                expected = item["outcome"]
                if any(answer.get(k) != expected.get(k) for k in OUTCOME):
                    mismatched += 1
        finally:
            proc.stdin.close()
            proc.wait()
        return mismatched
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as f:
        recording = json.load(f)
    episodes: list[list[dict[str, Any]]] = recording["episodes"]
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=int(recording["concurrency"])) as pool:
        mismatched = sum(
            pool.map(
                lambda requests: replay(
                    recording["python"], recording["executor"], recording["config"], requests
                ),
                episodes,
            )
        )
    floor_s = time.perf_counter() - started
    out = {
        "floor_s": round(floor_s, 4),
        "episodes": len(episodes),
        "requests": sum(len(e) for e in episodes),
        "mismatched": mismatched,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
