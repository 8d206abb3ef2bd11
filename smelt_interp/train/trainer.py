"""The training loop: AdamW under a WSD schedule with decay branches, MoE auxiliary losses,
gradient clipping and accumulation, bf16 autocast on CUDA, periodic evaluation, JSONL metrics,
atomic checkpoints, bitwise-exact resume on CPU, and a stop with a clear message on NaN.
`train_pair` trains a preset's Baseline and its budget-matched SMELT one after the other.

Beside it: one optimizer step and the metrics it leaves on the device (step.py), batches built
ahead of the step (prefetch.py), resume state and generators (state.py), device, optimizer."""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from tqdm import tqdm

from smelt_interp.budget import Budget
from smelt_interp.checkpoint import save_checkpoint
from smelt_interp.config import SMELT
from smelt_interp.data.bpe import tokenizer_record
from smelt_interp.errors import CheckpointError, ConfigError, TrainingDiverged
from smelt_interp.files import atomic_torch_save, atomic_write
from smelt_interp.model.protocol import autocast_for
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.provenance import CKPT_FILE, METRICS_FILE
from smelt_interp.train import parallel
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.curve_sinks import NO_SINKS, open_sinks, run_name
from smelt_interp.train.data import TrainingData
from smelt_interp.train.device import device_memory_bytes, resolve_device
from smelt_interp.train.distributed import DistEnv, init_distributed
from smelt_interp.train.evaluators import due, evaluate_all, run_evaluators
from smelt_interp.train.metrics import truncate_metrics
from smelt_interp.train.optim import build_optimizer
from smelt_interp.train.prefetch import BatchPrefetcher
from smelt_interp.train.presets import PAIR
from smelt_interp.train.run_folder import (
    KEPT_DIR,
    STATE_FILE,
    RunFolder,
    RunLog,
    check_folder_path,
    check_kept_folder,
    kept_checkpoints,
    kept_ckpt_name,
)
from smelt_interp.train.schedule import branch_plan
from smelt_interp.train.state import read_state, restore_rng, rng_state, run_record
from smelt_interp.train.step import MetricWindow, StepResult, optimizer_step

# Steps between reads of the step metrics from the device (and at every evaluation and save):
# each read waits for the device, so reading every step would leave it idle between steps.
READ_EVERY = 10


@dataclass
class RunResult:
    out_dir: Path
    checkpoint: Path
    branches: dict[int, Path]
    final_eval: dict[str, float]
    tokens: int
    seconds: float


class Trainer:
    """Trains one model into `out_dir`: ckpt.pt (model), state.pt (resume), metrics.jsonl."""

    def __init__(
        self,
        cfg: TrainConfig,
        out_dir: str | Path,
        *,
        resume: bool = False,
        progress: bool = True,
        on_metrics: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.out_dir = Path(out_dir)
        check_kept_folder(self.out_dir, cfg.checkpoint.keep_until)  # before anything is built
        self.device = resolve_device(cfg.runtime.device)
        self.env: DistEnv = init_distributed(self.device.type)
        if self.env.enabled and self.device.type == "cuda":
            self.device = torch.device("cuda", self.env.local_rank)
        if cfg.runtime.threads:
            torch.set_num_threads(cfg.runtime.threads)
        self.progress = progress and self.env.is_main
        self.on_metrics = on_metrics
        self.sinks = NO_SINKS  # TensorBoard and W&B (log.*), opened once _run knows the step
        self.model_cfg = cfg.model_config()
        self.model_cfg.check_memory()  # refused here, before anything is allocated
        cfg.check_memory(device_memory_bytes(self.device))
        self.data = TrainingData(cfg, rank=self.env.rank, world=self.env.world_size)
        torch.manual_seed(cfg.seed)
        self.model = cfg.kernels.apply(SmeltModel(self.model_cfg)).to(self.device)
        self.sharded = self.env.enabled and cfg.runtime.parallel == "fsdp"
        if self.sharded:  # before the optimizer, which must hold the sharded parameters
            parallel.shard_model(self.model, self.device)
        self.optimizer = build_optimizer(self.model, cfg)
        self.ema = self._build_ema()
        self.step = 0
        self.branches_done: list[int] = []
        self.resume = resume
        self.run_log = RunLog(self.out_dir, METRICS_FILE, resume)
        self._wrapped: torch.nn.Module | None = None
        self.evaluators = run_evaluators(cfg, self.data)
        self.batches = BatchPrefetcher(
            self.data, cfg.batch.grad_accum, self.model_cfg.vocab_size, self.device
        )
        self.window = MetricWindow(self._kept)
        self._window_started = time.perf_counter()
        self._bar: tqdm | None = None
        self._kept_cleared = False

    # ----- model plumbing ----------------------------------------------------------------
    @property
    def forward_model(self) -> torch.nn.Module:
        """The module the training step calls: DDP-wrapped when distributed (a sharded model is
        its own wrapper). With `compile`, each Block's training visit runs compiled: one graph
        serves every layer and visit (SmeltModel.compile_blocks).

        Evaluation, probes and hooked runs take the eager path of the same modules (a visit
        with a hook attached, or in eval mode, never runs compiled), the reference the compiled
        step is tested against."""
        if self._wrapped is None:
            module: torch.nn.Module = self.model
            if self.env.enabled and not self.sharded:
                from torch.nn.parallel import DistributedDataParallel

                module = DistributedDataParallel(
                    module, device_ids=[self.device.index] if self.device.type == "cuda" else None
                )
            if self.cfg.runtime.compile:
                self.model.compile_blocks(**self.cfg.kernels.compile_options())
            self._wrapped = module
        return self._wrapped

    def autocast(self):
        return autocast_for(self.device)

    def _build_ema(self) -> AveragedModel | None:
        """The weights' moving average (optim.ema_decay), a copy of the eager model updated
        after every optimizer step; None when off."""
        if not self.cfg.optim.ema_decay:
            return None
        if self.sharded:
            raise ConfigError("ema_decay needs unsharded weights; use parallel=ddp or no ema")
        average = get_ema_multi_avg_fn(self.cfg.optim.ema_decay)
        return AveragedModel(self.model, multi_avg_fn=average, use_buffers=False)

    @property
    def scored_model(self) -> SmeltModel:
        """The model evaluations score and ckpt.pt holds: the moving average when kept."""
        return self.model if self.ema is None else self.ema.module

    # ----- state ---------------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        """What state.pt holds; sharded, the full states gathered on rank 0 (every rank calls
        it), the optimizer's keyed by parameter name."""
        if self.sharded:
            weights = parallel.gathered_state(self.model, self.optimizer)
        else:
            weights = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}
        if self.ema is not None:
            weights["ema"] = self.ema.state_dict()
        return {
            "step": self.step,
            "branches_done": list(self.branches_done),
            **weights,
            "rng": rng_state(self.device),
            **run_record(self.cfg, self.data.tokenizer),
        }

    def _load_state(self, state: dict[str, Any]) -> None:
        if self.sharded:
            parallel.load_full_state(self.model, self.optimizer, state["model"], state["optimizer"])
        else:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        if self.ema is not None:
            self.ema.load_state_dict(state["ema"])
        restore_rng(state["rng"], self.device)
        self.step = int(state["step"])
        self.branches_done = [int(b) for b in state["branches_done"]]

    def check_finite(self) -> None:
        """Raise TrainingDiverged if a waiting step's loss or gradient norm, or any weight, is
        NaN or infinite: called before every save, so no checkpoint or training state ever
        holds a diverged model."""
        self.flush_metrics()
        bad = self._non_finite()
        if bad:
            raise TrainingDiverged(
                f"{bad} weight tensors became non-finite by step {self.step}; stopped, "
                f"{self._kept()}"
            )

    def _non_finite(self) -> int:
        """How many weight tensors hold a NaN or an infinity (sharded: shards, on any rank)."""
        flags = [parallel.local(p).isfinite().all() for p in self.model.parameters()]
        bad = int((~torch.stack(flags)).sum())  # one read back, not one per tensor
        if self.sharded:  # every rank must reach the same verdict
            count = torch.tensor(float(bad), device=self.device)  # NCCL reduces on the GPU
            torch.distributed.all_reduce(count)
            bad = int(count)
        return bad

    def _kept(self) -> str:
        return self.run_log.kept(self.out_dir / CKPT_FILE)

    def save_state(self) -> None:
        self.check_finite()
        state = self._state() if self.sharded or self.env.is_main else None
        if self.env.is_main:
            atomic_torch_save(state, self.out_dir / STATE_FILE)
            self.run_log.commit()
        self.env.barrier()

    def try_resume(self) -> bool:
        path = self.out_dir / STATE_FILE
        if not path.exists():
            return False
        state = read_state(path, self.cfg, self.data.tokenizer)  # CPU; sharded: each its shard
        try:
            self._load_state(state)
        except (KeyError, RuntimeError, TypeError, ValueError) as exc:
            raise CheckpointError(
                f"{path}: cannot resume, the training state is damaged ({type(exc).__name__})"
            ) from None
        if self._non_finite():
            raise CheckpointError(
                f"{path}: cannot resume, it holds non-finite weights (saved by a diverged run); "
                f"start again without --resume"
            )
        if self.env.is_main:
            truncate_metrics(self.out_dir / METRICS_FILE, self.step)
        return True

    def log(self, record: dict[str, Any]) -> None:
        if not self.env.is_main:
            return
        with open(self.run_log.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
        self.sinks.write(record)
        if self.on_metrics is not None:
            self.on_metrics(record)

    def save_model(self, path: Path, **meta: Any) -> None:
        self.check_finite()
        if self.sharded:
            weights = parallel.gathered_model_state(self.model)
        else:
            weights = self.scored_model.state_dict()
        if self.env.is_main:
            budget = Budget.of(self.model_cfg, self.cfg.batch.seq_len)
            save_checkpoint(
                path,
                self.model,
                weights=weights,
                arch=self.cfg.arch,
                step=self.step,
                tokens=self.step * self.tokens_per_step,
                flops_per_token=budget.flops,
                sparsity=budget.sparsity,
                non_embedding_params=budget.params,
                train_config=self.cfg.to_dict(),
                tokenizer=tokenizer_record(self.data.tokenizer),
                **meta,
            )
            self.run_log.commit()
        self.env.barrier()

    def keep_checkpoint(self) -> None:
        """Copy ckpt.pt, just saved, to the kept early checkpoint of this step (atomically, so
        the copy is the same file byte for byte). A fresh run's first copy first removes the
        kept checkpoints an earlier run in the folder left, which are not this run's."""
        if not self.env.is_main:
            return
        folder = self.out_dir / KEPT_DIR
        if not self.resume and not self._kept_cleared:
            for path in kept_checkpoints(self.out_dir).values():
                path.unlink(missing_ok=True)
            self._kept_cleared = True
        with open(self.out_dir / CKPT_FILE, "rb") as src:
            atomic_write(folder / kept_ckpt_name(self.step), lambda fh: shutil.copyfileobj(src, fh))

    @property
    def tokens_per_step(self) -> int:
        return self.cfg.tokens_per_step * self.env.world_size

    # ----- one optimizer step --------------------------------------------------------
    def train_step(self, lr: float) -> StepResult:
        """One optimizer step at learning rate `lr`. Nothing is read back from the device: the
        result's values are read when asked for (see step.MetricWindow for the loop's reads)."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)
        values = optimizer_step(
            self.model,
            self.forward_model,
            self.optimizer,
            lambda micro: self.batches.get(self.step, micro),
            self.cfg,
            self.env,
            self.autocast,
        )
        if self.ema is not None:
            self.ema.update_parameters(self.model)
        self.step += 1
        return StepResult(values, lr)

    def flush_metrics(self) -> None:
        """Read the waiting steps' metrics (one sync) and log them; raises TrainingDiverged at
        the first non-finite one. tokens/s is the mean over the steps read together."""
        if not len(self.window):
            return
        records = self.window.read()
        seconds = time.perf_counter() - self._window_started
        self._window_started = time.perf_counter()
        tokens_per_s = self.tokens_per_step * len(records) / max(seconds, 1e-9)
        for r in records:
            step = r.pop("step")
            tokens = step * self.tokens_per_step
            head = {"event": "train", "step": step, "tokens": tokens}
            self.log({**head, "tokens_per_s": tokens_per_s, **r})
        bar = self._bar
        if bar is not None and "branch" not in records[-1]:
            bar.update(len(records))
            bar.set_postfix(loss=f"{records[-1]['loss']:.3f}", tok_s=f"{tokens_per_s:,.0f}")

    # ----- evaluation ----------------------------------------------------------------
    def evaluate(self, greedy: bool = False, step: int | None = None) -> dict[str, float]:
        """The run's evaluators (evaluators.py) on the scored model, on rank 0: those due at
        `step`, or every periodic one; with `greedy` also the final ones (greedy Dyck
        decoding). A sharded model evaluates on every rank (its forward is collective); rank 0
        logs."""
        if not self.env.is_main and not self.sharded:
            return {}
        model = self.scored_model
        model.eval()
        with self.autocast():
            out = evaluate_all(self.evaluators, model, step, final=greedy)
        model.train()
        return out

    # ----- the run -------------------------------------------------------------------
    def run(self) -> RunResult:
        """Train to the last horizon, holding the run folder's lock throughout."""
        try:
            if not self.env.is_main:
                self.out_dir.mkdir(parents=True, exist_ok=True)
                return self._run()
            with RunFolder(self.out_dir, temp_names=(CKPT_FILE, STATE_FILE, METRICS_FILE)):
                return self._run()
        finally:
            self.batches.close()
            self.sinks.close()

    def _run(self) -> RunResult:
        cfg = self.cfg
        if self.resume and not self.try_resume():
            self.resume = False  # no state to resume from: a fresh run, the old log set aside
            if self.env.is_main:
                self.run_log.set_aside()
        elif not self.resume and self.env.is_main:
            self.run_log.start()
        at = self.step if self.resume else None  # a resumed run's curves go on from its step
        self.sinks = open_sinks(
            cfg.log, self.out_dir, run_name(self.out_dir), at, self.env.is_main, cfg.to_dict()
        )
        self.model.train()
        plan = branch_plan(cfg.schedule.horizons, cfg.schedule.decay_fraction)
        final_horizon = plan[-1][1]
        main_schedule = cfg.lr_schedule(final_horizon)
        branch_starts = {start: h for start, h in plan[:-1]}
        started = time.perf_counter()
        self._window_started = started
        self._bar = tqdm(
            total=final_horizon,
            initial=self.step,
            disable=not self.progress,
            desc=f"{cfg.arch}",
            unit="step",
            dynamic_ncols=True,
        )
        try:
            while self.step < final_horizon:
                horizon = branch_starts.get(self.step)
                if horizon is not None and horizon not in self.branches_done:
                    self.save_state()
                    self._run_branch(horizon)
                    continue
                self.window.add(self.step + 1, self.train_step(main_schedule(self.step)))
                if self.step % READ_EVERY == 0:
                    self.flush_metrics()
                if self.step < final_horizon and any(due(e, self.step) for e in self.evaluators):
                    self._eval_and_log(step=self.step)
                if self.step % cfg.checkpoint.every == 0 and self.step < final_horizon:
                    self.save_state()
                    self.save_model(self.out_dir / CKPT_FILE, final=False)
                    if self.step <= cfg.checkpoint.keep_until:
                        self.keep_checkpoint()
        finally:
            self._bar.close()
            self._bar = None
        last_eval = self._eval_and_log(greedy=True)
        self.save_model(self.out_dir / CKPT_FILE, final=True, eval=last_eval)
        self.save_state()
        return RunResult(
            self.out_dir,
            self.out_dir / CKPT_FILE,
            {h: self.out_dir / f"branch-{h}" / CKPT_FILE for h in self.branches_done},
            last_eval,
            self.step * self.tokens_per_step,
            time.perf_counter() - started,
        )

    def _run_branch(self, horizon: int) -> None:
        """Decay from the current stable state to `horizon`, save it, and restore the state."""
        weights = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}
        ema = None if self.ema is None else self.ema.state_dict()
        snapshot = copy.deepcopy({**weights, "ema": ema, "step": self.step})
        schedule = self.cfg.lr_schedule(horizon)
        while self.step < horizon:
            self.window.add(self.step + 1, self.train_step(schedule(self.step)), branch=horizon)
            if self.step % READ_EVERY == 0:
                self.flush_metrics()
        result = self._eval_and_log(greedy=True, branch=horizon)
        self.save_model(
            self.out_dir / f"branch-{horizon}" / CKPT_FILE, final=True, eval=result, branch=horizon
        )
        self.model.load_state_dict(snapshot["model"])
        self.optimizer.load_state_dict(snapshot["optimizer"])
        if self.ema is not None:
            self.ema.load_state_dict(snapshot["ema"])
        self.step = snapshot["step"]
        self.branches_done.append(horizon)
        self.save_state()
        if self._bar is not None:
            self._bar.set_postfix_str(f"branch {horizon} saved")

    def _eval_and_log(self, greedy: bool = False, step: int | None = None, **extra: Any):
        self.flush_metrics()  # the train records first, and no evaluation of a diverged model
        result = self.evaluate(greedy, step)
        if result:
            tokens = self.step * self.tokens_per_step
            self.log({"event": "eval", "step": self.step, "tokens": tokens, **extra, **result})
            if self.progress:
                shown = ", ".join(f"{k} {v:.3f}" for k, v in result.items())
                tqdm.write(f"[{self.cfg.arch}] step {self.step}: {shown}")
        return result


def pair_configs(base: TrainConfig) -> dict[str, TrainConfig]:
    """The same run twice, once per architecture, each at its `arch_lr` learning rate if set.
    The Baseline, which has no looped layers, gets `loop_lr_scale` 1, so a new scale leaves the
    pair's Baseline runs resumable and reusable."""
    return {
        arch: dataclasses.replace(
            base,
            arch=arch,
            optim=dataclasses.replace(
                base.optim,
                lr=base.optim.arch_lr.get(arch, base.optim.lr),
                loop_lr_scale=base.optim.loop_lr_scale if arch == SMELT else 1.0,
            ),
        )
        for arch in PAIR
    }


def train_pair(
    base: TrainConfig,
    out_dir: str | Path,
    *,
    archs: Sequence[str] = PAIR,
    resume: bool = False,
    progress: bool = True,
    on_metrics: Callable[[str, dict[str, Any]], None] | None = None,
) -> dict[str, RunResult]:
    """Train each architecture of the pair in turn into `<out_dir>/<arch>`; their results."""
    check_folder_path(out_dir)  # before the first model trains, not after it
    configs = {arch: cfg for arch, cfg in pair_configs(base).items() if arch in archs}
    for cfg in configs.values():  # an unmatched SMELT is refused before the Baseline trains
        cfg.model_config().check_memory()
    results = {}
    for arch, cfg in configs.items():
        callback = (lambda rec, a=arch: on_metrics(a, rec)) if on_metrics else None
        trainer = Trainer(
            cfg, Path(out_dir) / arch, resume=resume, progress=progress, on_metrics=callback
        )
        results[arch] = trainer.run()
    return results
