"""The generation cache of ``kpo eval`` and each sample's seed.

Resumability: completions are appended to a jsonl cache, one batch at a time, flushed and fsync'd, so a
killed run loses at most the batch in flight. A record's key is (model, dataset, problem id, sample index,
sampling parameters, prompt hash); a rerun with the same key skips the work.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

from kpo._files import complete_part, writing


def sample_seed(seed: int, dataset: str, problem_id: str, sample: int) -> int:
    """The 63-bit seed of one sample: a stable hash of (seed, dataset, problem id, sample index)."""
    digest = hashlib.sha256(f"{seed}\x1f{dataset}\x1f{problem_id}\x1f{sample}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def prompt_hash(prompt: str) -> str:
    return hashlib.sha256(prompt.encode()).hexdigest()[:16]


class GenerationCache:
    """Append-only jsonl of completions; see the module docstring for the key.

    A line cut short by a kill or a full disk (the batch in flight) is dropped on open (``torn``: its bytes), so
    appends resume on a clean line. A corrupt line anywhere else is an error naming the line.
    """

    KEY_FIELDS = ("model", "dataset", "id", "sample", "params", "prompt_sha")

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._records: dict[str, dict] = {}
        self.torn = 0
        if self.path.exists():
            self._load()

    @classmethod
    def key(cls, record: dict) -> str:
        return json.dumps([record[f] for f in cls.KEY_FIELDS], sort_keys=True)

    def _load(self) -> None:
        data = self.path.read_bytes()
        complete = complete_part(data)
        self.torn = len(data) - len(complete)
        if self.torn:
            # The process died mid-write: drop the partial tail so the next append starts a fresh line.
            with open(self.path, "r+b") as f:
                f.truncate(len(complete))
        for lineno, line in enumerate(complete.decode("utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                self._records[self.key(record)] = record
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ValueError(
                    f"{self.path}: line {lineno} is not a generation record ({e}); delete the file to start over"
                ) from e

    def get(self, record_key: str) -> dict | None:
        return self._records.get(record_key)

    def __len__(self) -> int:
        return len(self._records)

    def append(self, records: Sequence[dict]) -> None:
        """Write `records` as one durable batch (flush + fsync before returning)."""
        with writing(self.path):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as f:
                f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
                f.flush()
                os.fsync(f.fileno())
        for r in records:
            self._records[self.key(r)] = r
