"""What a checkpoint was trained on, answered once: the task its run measures (associative
recall when the run's data mix gives it weight, else Dyck), that task's spec as the run drew it,
its run folder and the metrics log in it. The trainer, the probes, the commands and the
dashboard all ask here, so a recall model is measured on recall rows everywhere.

The run folder's two files a checkpoint points at are named here too (`CKPT_FILE`,
`METRICS_FILE`); train/run_folder.py names the rest of the folder's files."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smelt_interp.checkpoint import CheckpointInfo
from smelt_interp.data.assoc_recall import AssocRecallSpec
from smelt_interp.data.computed_recall import ComputedRecallSpec
from smelt_interp.data.dyck import DyckSpec
from smelt_interp.errors import CheckpointError, SmeltError

CKPT_FILE = "ckpt.pt"  # the model (the latest checkpoint)
METRICS_FILE = "metrics.jsonl"  # the training log, one JSON record a line

TASK_DYCK = "dyck"
TASK_RECALL = "assoc_recall"
TASKS = (TASK_DYCK, TASK_RECALL)  # the tasks a checkpoint is measured on (the case study's)
TASK_COMPUTED = "computed_recall"  # computed-class recall: the linear probe's and ablation's rows


def task_of_mix(data: Any) -> str:
    """The task a run with data mix `data` ({domain: weight}) is measured on: associative recall
    when the mix gives it weight > 0, else Dyck."""
    weight = data.get(TASK_RECALL, 0) if isinstance(data, Mapping) else 0
    return TASK_RECALL if isinstance(weight, int | float) and weight > 0 else TASK_DYCK


@dataclass(frozen=True)
class Provenance:
    """Where a checkpoint came from: `path`, the checkpoint file (or, for a run still without
    one, its run folder) and `train_config`, the TrainConfig its run saved (None for a model
    saved by other code, which is measured with the defaults)."""

    path: Path
    train_config: Mapping[str, Any] | None = None

    @classmethod
    def of(cls, info: CheckpointInfo) -> Provenance:
        return cls(Path(info.path), info.train_config)

    @property
    def _config(self) -> Mapping[str, Any]:
        return self.train_config or {}

    @property
    def task(self) -> str:
        """`assoc_recall` when the run's data gave that domain weight > 0, else `dyck`."""
        return task_of_mix(self._config.get("data"))

    @property
    def dyck_spec(self) -> DyckSpec:
        """The Dyck spec the run drew its words from (the default for a checkpoint without
        one)."""
        return self._spec("dyck", DyckSpec)

    @property
    def recall_spec(self) -> AssocRecallSpec:
        """The associative-recall spec the run drew its rows from. A checkpoint that trained on
        recall must record it (CheckpointError otherwise); any other gets the default."""
        if self.task == TASK_RECALL and self._config.get(TASK_RECALL) is None:
            raise CheckpointError(
                f"{self.path}: trained on assoc_recall but records no assoc_recall spec in its "
                f"training config, so its recall rows cannot be rebuilt"
            )
        return self._spec(TASK_RECALL, AssocRecallSpec)

    def trained_on(self, domain: str) -> bool:
        """Whether the run's data mix gave `domain` weight > 0."""
        data = self._config.get("data")
        weight = data.get(domain, 0) if isinstance(data, Mapping) else 0
        return isinstance(weight, int | float) and weight > 0

    @property
    def computed_spec(self) -> ComputedRecallSpec:
        """The computed-recall spec the run drew its rows from (its tables come from the spec's
        `table_seed`, so rows are only meaningful under this spec); the default for a checkpoint
        that records none."""
        return self._spec(TASK_COMPUTED, ComputedRecallSpec)

    @property
    def task_spec(self) -> DyckSpec | AssocRecallSpec:
        """The spec of `task`."""
        return self.recall_spec if self.task == TASK_RECALL else self.dyck_spec

    def row_len(self, task: str | None = None) -> int | None:
        """The row length the run trained `task` (default: its own) on: its `row_len` for the
        task, else its `seq_len`; None when the config names neither."""
        per_task = self._config.get("row_len")
        length = per_task.get(task or self.task) if isinstance(per_task, Mapping) else None
        length = length or self._config.get("seq_len")
        return int(length) if isinstance(length, int) and not isinstance(length, bool) else None

    @property
    def run_folder(self) -> Path:
        """The folder the run wrote: the checkpoint's parent, or `path` when it is a folder."""
        return self.path.parent if self.path.suffix else self.path

    @property
    def metrics_file(self) -> Path:
        """The run's training log (it may not exist: a model saved by other code has none)."""
        return self.run_folder / METRICS_FILE

    def _spec(self, key: str, cls: type) -> Any:
        trained = self._config.get(key)
        if trained is None:
            return cls()
        try:
            return cls.from_mapping(trained)
        except SmeltError as exc:
            raise CheckpointError(f"{self.path}: its {key} spec is invalid ({exc})") from None
