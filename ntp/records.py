"""The results contract: what a training job reports, as typed records.

Rank 0 writes one :class:`EpochRecord` per epoch and a :class:`FinalRecord` at the end to its sinks (the JSON-lines
results file, the console; the driver follows the file into MLflow). Everything downstream (tracking, compare,
plots, the Prefect artifact) reads these types, never loose dicts.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(kw_only=True)
class WorkerStats:
    """One rank in one epoch: time, traffic and memory."""

    rank: int
    compute_s: float  #: epoch time minus exposed communication time
    comm_s: dict[str, float] = field(default_factory=dict)  #: exposed seconds per communication kind
    bytes_sent: dict[str, int] = field(default_factory=dict)
    bytes_recv: dict[str, int] = field(default_factory=dict)
    peak_mem_bytes: int = 0  #: the epoch's peak: the largest phase peak where phases were measured
    peak_mem_by_phase: dict[str, int] = field(default_factory=dict)
    cpu_s: float = 0.0  #: CPU seconds of all this process's threads (compute and communication)
    chunks: int = 1  #: aggregation chunks
    overlap_s: float = 0.0  #: time collectives were in flight while this rank computed
    overlapped: bool = False  #: split/gather overlapped with aggregation (--overlap)
    nn_device: str = "cpu"
    offload: str = "none"
    host_pss_bytes: int = 0  #: resident host memory, shared pages divided among their processes (sum a node's ranks)
    topology_bytes: int = (
        0  #: the topology arrays (ntp.engine.graph.topology), one copy per node when its ranks share it
    )
    device_topology_bytes: int = 0  #: what the topology keeps resident on the rank's device (0 on CPU, or offloaded)
    host: str = ""  #: the machine the rank ran on

    @property
    def comm_total_s(self) -> float:
        return float(sum(self.comm_s.values()))

    @property
    def sent_total(self) -> int:
        return int(sum(self.bytes_sent.values()))

    @property
    def recv_total(self) -> int:
        return int(sum(self.bytes_recv.values()))


@dataclass(kw_only=True)
class EpochRecord:
    epoch: int
    loss: float
    epoch_s: float
    train_metric: float | None = None  #: None: not evaluated this epoch
    valid_metric: float | None = None
    test_metric: float | None = None
    valid_loss: float | None = None  #: under --monitor loss
    lr: float | None = None  #: the learning rate this epoch trained with (--lr-schedule)
    eval_s: float | None = None  #: seconds rank 0 spent evaluating after the epoch (None: not evaluated)
    workers: list[WorkerStats] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        """The split metrics evaluated this epoch, by split name."""
        pairs = (("train", self.train_metric), ("valid", self.valid_metric), ("test", self.test_metric))
        return {k: v for k, v in pairs if v is not None}


@dataclass(kw_only=True)
class FinalRecord:
    best_epoch: int
    best_valid_metric: float | None
    test_metric: float | None  #: at the best validation epoch
    metric: str
    world_size: int
    task_type: str = ""  #: multiclass, binary, multilabel or link ("" in files written before it was recorded)
    target_type: str = ""  #: heterogeneous graphs: the node type the metric is about ("": homogeneous)
    epochs_run: int = 0  #: 0 in files written before it was recorded
    store_fingerprint: str = ""
    config: dict[str, Any] = field(default_factory=dict)

    def kept_at(self) -> str:
        """Which epoch's weights the run kept, and why, for people: "the best validation epoch 12 (valid acc
        0.8123)", or the last epoch when no valid split was held out (--fit-on train+valid)."""
        if self.best_valid_metric is None:
            return f"the last epoch {self.best_epoch + 1} (trained on train+valid: no validation metric)"
        return f"the best validation epoch {self.best_epoch + 1} (valid {self.metric} {self.best_valid_metric:.4f})"


Record = EpochRecord | FinalRecord


def to_json(record: Record) -> str:
    data = dataclasses.asdict(record)
    if isinstance(record, FinalRecord):
        data["final"] = True
    return json.dumps(data)


def from_dict(data: dict[str, Any]) -> Record:
    """A record from its JSON form; keys this version does not know are ignored (files of other versions)."""
    if data.get("final"):
        return _build(FinalRecord, data)
    workers = [_build(WorkerStats, w) for w in data.get("workers") or []]
    return _build(EpochRecord, {**data, "workers": workers})


def _build(cls: type, data: dict[str, Any]) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class Results:
    """A parsed results file: epoch records, then the final record (None while running or after a crash)."""

    epochs: list[EpochRecord] = field(default_factory=list)
    final: FinalRecord | None = None

    @property
    def world_size(self) -> int:
        return max((len(e.workers) for e in self.epochs), default=0)

    def add(self, record: Record) -> None:
        if isinstance(record, FinalRecord):
            self.final = record
        else:
            self.epochs.append(record)


def parse_lines(lines: list[str]) -> list[Record]:
    """Records of complete JSON lines; a truncated line (a crash while writing) is skipped."""
    out = []
    for line in lines:
        if not line.strip():
            continue
        try:
            out.append(from_dict(json.loads(line)))
        except (json.JSONDecodeError, TypeError):
            continue
    return out


def read_results(path: str | Path) -> Results:
    """Parse a results file (missing: empty results)."""
    res = Results()
    p = Path(path)
    if p.is_file():
        for rec in parse_lines(p.read_text().splitlines()):
            res.add(rec)
    return res
