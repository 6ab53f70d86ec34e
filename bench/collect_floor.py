"""The collection benchmark's floor: the recorded executor requests replayed on the host.

    python -I -S bench/collect_floor.py RECORDING.json   (run by bench/collect_throughput.py)

RECORDING holds what every episode jail of a real collection was asked, request by request
(workspace population, each tool call, the verifier, exports), with the executor's
configuration and the concurrency. This script starts, per episode, the same in-jail
executor (`sandbox/jail_executor.py`, the same interpreter and flags) directly on the host
with a fresh temporary directory as its workspace (no nsjail), sends it the same frames
(`/workspace` rewritten to that directory), and ends it with SIGKILL as the platform ends
a jail; each concurrency slot starts its next executor while the current one serves, as
the platform's warm pool does: no policy, no Prefect, no SQL, no
object store, no trajectory objects. It is a small separate process (stdlib only, `-I -S`)
so that its process starts do not pay for a large parent's address space. It prints one
JSON object: `floor_s`, `episodes`, `requests`, `mismatched` (answers whose outcome —
`ok`, `exit_code`, `timed_out` — differs from the one the jail gave; 0 when the replay did
what the collection did) and `setup_cpu_s` (this process's CPU before the replay began:
its start and reading the recording, which the caller takes off the floor's CPU).
"""

import json
import queue
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


class HostExecutor:
    """The in-jail executor started on the host, its workspace a fresh temporary directory."""

    def __init__(self, python: str, executor: str, config: dict[str, Any]) -> None:
        self.root = tempfile.mkdtemp(prefix="epiflow-floor-")
        own = json.dumps({**config, "workspace": self.root})
        self.proc = subprocess.Popen(
            [python, "-I", "-S", "-B", executor, own],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=self.root,
        )

    def replay(self, requests: list[dict[str, Any]]) -> int:
        """The recorded requests, one frame at a time; returns how many answers differ in
        outcome from the recorded ones."""
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None
        _frame(stdout)  # ready
        mismatched = 0
        for item in requests:
            body = json.dumps(item["payload"], separators=(",", ":"))
            data = body.replace("/workspace", self.root).encode("ascii")
            stdin.write(len(data).to_bytes(4, "big") + data)
            stdin.flush()
            answer = _frame(stdout)
            if any(answer.get(k) != item["outcome"].get(k) for k in OUTCOME):
                mismatched += 1
        return mismatched

    def close(self) -> None:
        """SIGKILL, as the platform ends a jail (no interpreter teardown)."""
        self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()
        shutil.rmtree(self.root, ignore_errors=True)


def worker(recording: dict[str, Any], todo: "queue.SimpleQueue[list[dict[str, Any]]]") -> int:
    """One slot of the concurrency: like the platform's warm pool, the next episode's
    executor is started before this one's requests are sent, so its start overlaps them."""

    def start() -> HostExecutor:
        return HostExecutor(recording["python"], recording["executor"], recording["config"])

    mismatched = 0
    spare: HostExecutor | None = None
    while True:
        try:
            requests = todo.get_nowait()
        except queue.Empty:
            break
        current = spare or start()
        spare = start() if not todo.empty() else None
        try:
            mismatched += current.replay(requests)
        finally:
            current.close()
    if spare is not None:
        spare.close()
    return mismatched


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as f:
        recording = json.load(f)
    episodes: list[list[dict[str, Any]]] = recording["episodes"]
    todo: queue.SimpleQueue[list[dict[str, Any]]] = queue.SimpleQueue()
    for requests in episodes:
        todo.put(requests)
    slots = min(int(recording["concurrency"]), len(episodes))
    setup_cpu_s = time.process_time()  # start-up and reading the recording: not the floor's
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=slots) as pool:
        mismatched = sum(pool.map(lambda _: worker(recording, todo), range(slots)))
    floor_s = time.perf_counter() - started
    out = {
        "floor_s": round(floor_s, 4),
        "episodes": len(episodes),
        "requests": sum(len(e) for e in episodes),
        "mismatched": mismatched,
        "setup_cpu_s": round(setup_cpu_s, 4),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
