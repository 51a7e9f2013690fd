"""`hvdcls train`: one command for both frameworks, one process or many.

    hvdcls train --backend torch                                   # digits, one process
    horovodrun -np 2 -H localhost:2 hvdcls train --backend tensorflow --config configs/digits.yaml
    horovodrun -np 8 -H host1:4,host2:4 hvdcls train --backend torch \\
        --config configs/resnet50.yaml data.path=/data/imagenet
    mpirun -np 4 -bind-to none -map-by slot hvdcls train --backend torch --data /data/imagenet.lmdb

Order matters: the data is opened (and bad paths refused) before Horovod starts, so a user
error ends every rank at once with one line instead of leaving ranks waiting on each other.
"""
from __future__ import annotations

import abc
import dataclasses
import os
import platform
import socket
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from hvdcls import __version__, modelcard, pretrained, registry
from hvdcls import config as cfg
from hvdcls.backend import Backend, Context, share_cores, weights_digest
from hvdcls.data import bad_files, datasets
from hvdcls.data.sources import Data
from hvdcls.errors import JobStopped, UserError
from hvdcls.files import status_file
from hvdcls.launching import allocator, horovod_env
from hvdcls.maths import tensor_parallel
from hvdcls.observe.classification import EVALUATION_FILE
from hvdcls.observe.monitor import EpochRecord, Monitor, Sink
from hvdcls.training import balance, checkpoint, elastic, lr_sweep, memory, watchdog
from hvdcls.training.loop import Trainer
from hvdcls.training.outputs import RunOutputs, default_run_dir


def on_main_then_share(backend: Backend, ctx: Context, work: Callable[[], object], name: str,
                       share_result: bool = True):
    """Run `work` on rank 0 only and give its result to every rank; a UserError raised there is
    raised on every rank too, so no rank is left waiting in a collective. With
    share_result=False only the outcome travels: rank 0 gets the result, the others None."""
    outcome: tuple = ("ok", None)
    result = None
    if ctx.is_main:
        try:
            result = work()
            outcome = ("ok", result if share_result else None)
        except UserError as err:
            outcome = ("error", str(err))
    kind, value = backend.broadcast_object(outcome, name) if ctx.size > 1 else outcome
    if kind == "error":
        raise UserError(value)
    return value if share_result else result


def read_resume(config: cfg.Config, backend_name: str) -> Optional[checkpoint.Resumed]:
    if not config.training.resume:
        return None
    return checkpoint.read_state(checkpoint.resolve(Path(config.training.resume)), backend_name)


def choose_run_dir(config: cfg.Config, backend: str, resumed: Optional[checkpoint.Resumed]) -> Path:
    if config.output.dir:
        return Path(config.output.dir)
    return checkpoint.run_dir_of(resumed.directory if resumed else None) or default_run_dir(backend)


@dataclass(frozen=True)
class Job:
    """What a run is given before its world starts: the same on every rank."""

    config: cfg.Config
    backend_name: str
    backend: Backend
    data: Data
    num_classes: int
    horovod_settings: dict  # what Horovod read in hvd.init(), for the summary
    started: float
    lr_find: Optional[dict] = None  # optimizer.lr=auto: the range test's account (lr_sweep)


@dataclass(frozen=True)
class Ended:
    """Where training left a run: the world it ended in and every epoch's record."""

    ctx: Context
    outputs: RunOutputs
    history: list[EpochRecord]
    extra: dict  # summary sections only this kind of run has


def train(config: cfg.Config, backend_name: str) -> dict:
    """Train as configured; returns the summary (rank 0 also writes it)."""
    started = time.time()
    memory.PEAKS.restart()  # summary.json's peaks per phase are this run's
    data = datasets.open_data(config)
    num_classes = datasets.check_num_classes(config, data)
    # Horovod reads them in hvd.init()
    dropped = horovod_env.dropped_cycle(config.horovod, os.environ, config.training.elastic)
    horovod_settings = horovod_env.apply(config.horovod, elastic=config.training.elastic)
    backend = registry.create_backend(backend_name)
    job = Job(config, backend_name, backend, data, num_classes, horovod_settings, started)
    ctx = backend.init(config)
    if dropped and ctx.is_main:
        print(f"hvdcls: warning: {dropped}", file=sys.stderr)
    check_controller(config, ctx)
    tensor_parallel.check_run(config.parallel.tensor, backend_name, ctx.size)  # before any work
    balance.settings(config, ctx.size // config.parallel.tensor,  # bad plans: before any work (per replica)
                     ctx.device.startswith("cuda"))
    if not config.training.elastic:  # elastic: at each attempt's start, which a joining worker meets too
        ctx = share_cores(backend, ctx, config)
    kind: RunKind = ElasticRun() if config.training.elastic else PlainRun()
    dog = kind.start_watchdog(job, ctx)
    try:
        return train_watched(job, ctx, kind, dog)
    finally:
        dog.stop()


def train_watched(job: Job, ctx: Context, kind: "RunKind", dog: watchdog.Watchdog) -> dict:
    """train() once this rank's watchdog runs: every phase from here on is bounded."""
    backend, data = job.backend, job.data
    resumed = kind.read_resume(job, ctx)
    outputs = RunOutputs(choose_run_dir(job.config, job.backend_name, resumed), enabled=ctx.is_main)
    dog.last_record = stop_writer(job, ctx, outputs)  # elastic: rebound to each attempt's world
    backend.seed(job.config.training.seed)  # the same initial weights for the same seed, run after run
    model_info = backend.build(job.config, job.num_classes)  # optimizer.lr=auto: config.worker_lr's stand-in
    # optimizer.lr=auto: the range test, from the initial weights, and restored (a resumed run
    # takes the rate its checkpoint recorded); then the banner names the rate.
    with bad_file_failures(data):
        config, found = lr_sweep.resolve(job.config, backend, ctx, data, dog.phases,
                                         resumed.state if resumed is not None else None)
    job = dataclasses.replace(job, config=config, lr_find=found)
    dog.last_record = stop_writer(job, ctx, outputs)  # its record: the rate trained with
    outputs.say(banner(job, ctx, kind.label, outputs.run_dir, model_info.get("weights")))
    start_epoch, history = kind.restore(job, ctx, resumed, outputs)
    if config.training.eval_only:  # plain runs only: the config refuses it with elastic
        trainer = Trainer(config, backend, ctx, data, outputs, phases=dog.phases)
        assert resumed is not None  # the config refuses eval_only without resume
        return evaluate_only(trainer, backend, ctx, resumed, outputs)
    with Monitor(kind.make_sinks(job, ctx, outputs)) as monitor, failures_told(monitor):
        outputs.write_config(cfg.to_yaml(config))
        outputs.write_json(modelcard.CARD_FILE, run_card(config, job).to_dict())
        with bad_file_failures(data):
            ended = kind.train(job, ctx, outputs, monitor, start_epoch, history, dog)
        dog.phases.enter(watchdog.FINISHING)
        summary = closing_summary(job, ended, model_info, resumed)
        summary["heartbeats"] = dog.heard()  # rank 0: from every rank of the final world
        dog.stop()  # the last collective is done; rank 0 may linger for a last scrape
        publish(summary, ended.outputs, monitor, kind.details(summary))
    return summary


@contextmanager
def failures_told(monitor: Monitor):
    """The watchers hear how the run failed (status.json's `failed` phase), then it goes on up."""
    try:
        yield
    except Exception as err:
        monitor.failed(str(err).splitlines()[0] if str(err) else type(err).__name__)
        raise


def run_card(config: cfg.Config, job: Job) -> modelcard.ModelCard:
    """RUN_DIR/model_card.json: the classes and preprocessing evaluation, export and predict
    read; the weights they use are the EMA's when the run keeps one."""
    card = modelcard.from_config(config, job.backend_name, job.data.classes)
    card.weights = "ema" if config.training.ema_decay is not None else "model"
    return card


def banner(job: Job, ctx: Context, label: str, run_dir: Path, weights: Optional[dict] = None) -> str:
    data = job.data
    return (f"hvdcls {__version__}: {job.backend_name} backend, {label}{ctx.size} process(es) "
            f"({ctx.controller}), {data.name}: {len(data.train)} train / {len(data.val)} val "
            f"images, {job.num_classes} classes, augment {augment_line(data)}, "
            f"{lr_line(job, ctx)}, {weights_line(job.config, weights)} -> {run_dir}")


def weights_line(config: cfg.Config, loaded: Optional[dict]) -> str:
    """'weights: the file r18.pth (head fc replaced: 1000 -> 10 classes), preprocessing: ...'.
    `loaded`: what the backend's build reported of model.weights (model_info['weights'])."""
    source = pretrained.parse(config.model.weights)
    if source.kind == "none":
        return "weights: random initialisation"
    line = f"weights: {source.describe()}"
    if loaded and loaded.get("replaced"):
        line += f" (head replaced: {', '.join(loaded['replaced'])})"
    if loaded and loaded.get("interpolated"):
        line += f" ({', '.join(loaded['interpolated'])} interpolated)"
    expected = pretrained.preprocessing(source, config.model.name)
    data = config.data
    if expected is not None and ([round(v, 6) for v in data.mean], [round(v, 6) for v in data.std]) == \
            ([round(v, 6) for v in expected.mean], [round(v, 6) for v in expected.std]):
        return line + f", preprocessing from {expected.source}"
    return line + f", preprocessing data.mean={data.mean} data.std={data.std} (the config's)"


def lr_line(job: Job, ctx: Context) -> str:
    """'lr 0.4 per256 (0.05 a step)', and how it was chosen when the range test chose it."""
    opt = job.config.optimizer
    replicas = ctx.size // job.config.parallel.tensor  # parallel.tensor: a replica's T ranks read one batch
    step = cfg.peak_lr(opt, replicas, job.config.horovod.backward_passes_per_step,
                       job.config.training.batch_size)
    line = f"lr {cfg.numeric_lr(opt):.4g} {opt.scale_lr} ({step:.4g} a step)"
    if job.lr_find is not None and job.lr_find.get("resumed"):
        line += " (auto: the rate of the run it resumes)"
    elif job.lr_find is not None:
        line += f" by the range test: {job.lr_find['reason']}, {job.lr_find['steps']} steps"
    return line


def augment_line(data: Data) -> str:
    """'small (auto: native 32 px < 64)': the preset and why, for the banner."""
    return f"{data.augment.get('preset', 'imagenet')} ({data.augment.get('chosen_by', 'config')})"


def closing_summary(job: Job, ended: Ended, model_info: dict,
                    resumed: Optional[checkpoint.Resumed]) -> dict:
    """summary.json's content (collectives: every rank of the final world calls this)."""
    backend, data = job.backend, job.data
    summary = make_summary(job.config, ended.ctx, data, model_info, job.horovod_settings,
                           ended.history, job.started, resumed)
    summary.update(ended.extra)
    summary["lr_find"] = job.lr_find
    skipped = data.bad_files.skipped() if data.bad_files is not None else []
    summary["bad_files"] = bad_files.summarise(job.config.data.bad_files,
                                               backend.allgather_object(skipped, "bad_files"))
    summary["communication"] = backend.communication()
    summary["memory"], summary["rank_memory"] = memory.summarise(backend)
    return with_rank_facts(summary, backend)


class RunKind(abc.ABC):
    """Where a plain run and an elastic one differ; train() above is what they share."""

    label = ""  # in the banner, before the process count

    @abc.abstractmethod
    def read_resume(self, job: Job, ctx: Context) -> Optional[checkpoint.Resumed]:
        """--resume's checkpoint, read as this kind of run may (None without --resume)."""

    @abc.abstractmethod
    def restore(self, job: Job, ctx: Context, resumed: Optional[checkpoint.Resumed],
                outputs: RunOutputs) -> tuple[int, list[EpochRecord]]:
        """(epochs done, their records): from the checkpoint, or (0, []) for a new run."""

    @abc.abstractmethod
    def make_sinks(self, job: Job, ctx: Context, outputs: RunOutputs) -> list[Sink]:
        """Rank 0's watchers (hvdcls.training.run.make_sinks); none on other ranks."""

    @abc.abstractmethod
    def start_watchdog(self, job: Job, ctx: Context) -> watchdog.Watchdog:
        """This rank's watchdog, started (hvdcls.training.watchdog)."""

    @abc.abstractmethod
    def train(self, job: Job, ctx: Context, outputs: RunOutputs, monitor: Monitor,
              start_epoch: int, history: list[EpochRecord], dog: watchdog.Watchdog) -> Ended:
        """Every remaining epoch, from `start_epoch` on."""

    @abc.abstractmethod
    def details(self, summary: dict) -> str:
        """The closing line's words about this run."""


class PlainRun(RunKind):
    """A fixed world: rank 0 reads what all need and shares it; a failure ends the job."""

    def read_resume(self, job: Job, ctx: Context) -> Optional[checkpoint.Resumed]:
        return on_main_then_share(job.backend, ctx,
                                  lambda: read_resume(job.config, job.backend_name), "resume")

    def restore(self, job: Job, ctx: Context, resumed: Optional[checkpoint.Resumed],
                outputs: RunOutputs) -> tuple[int, list[EpochRecord]]:
        if resumed is None:
            return 0, []
        backend = job.backend
        # A checkpoint rank 0 cannot read stops every rank, not just rank 0.
        on_main_then_share(backend, ctx, lambda: backend.load(resumed.directory), "load")
        backend.broadcast_state()  # Horovod: every rank continues from rank 0's checkpoint
        outputs.say(f"resumed from {resumed.directory} after epoch {resumed.state['epoch']}")
        return resumed_progress(resumed)

    def make_sinks(self, job: Job, ctx: Context, outputs: RunOutputs) -> list[Sink]:
        # A busy metrics port on rank 0 stops every rank.
        sinks = on_main_then_share(job.backend, ctx,
                                   lambda: make_sinks(job.config, job.backend_name, outputs),
                                   "monitor", share_result=False)
        return sinks or []

    def start_watchdog(self, job: Job, ctx: Context) -> watchdog.Watchdog:
        # Every rank joins the broadcast of rank 0's heartbeat address.
        def share(address):
            return job.backend.broadcast_object(address, "heartbeat")

        return watchdog.start(job.config.training.stall_timeout_seconds, ctx.rank, ctx.size, share)

    def train(self, job: Job, ctx: Context, outputs: RunOutputs, monitor: Monitor,
              start_epoch: int, history: list[EpochRecord], dog: watchdog.Watchdog) -> Ended:
        with horovod_shutdown(ctx, dog):
            trainer = Trainer(job.config, job.backend, ctx, job.data, outputs, monitor, dog.phases)
            history = trainer.run(start_epoch, history)
        extra = {"balance": trainer.rebalancer.balancer.summary()} if trainer.rebalancer else {}
        return Ended(ctx, outputs, history, extra)

    def details(self, summary: dict) -> str:
        rate = summary["images_per_sec"]  # None: a resume of a finished run trained no epoch
        speed = f"{rate:.1f} img/s" if rate is not None else "no epoch left to train"
        return f"(best {summary['best_val_accuracy']:.4f}), {speed}"


class ElasticRun(RunKind):
    """Horovod's elastic mode (hvdcls.training.elastic). Until the elastic loop syncs, no rank
    may run a collective: a worker added later starts here while the others are inside the
    loop, so every rank reads --resume itself and rank 0 makes its watchers alone."""

    label = "elastic, "

    def read_resume(self, job: Job, ctx: Context) -> Optional[checkpoint.Resumed]:
        return read_resume(job.config, job.backend_name)

    def restore(self, job: Job, ctx: Context, resumed: Optional[checkpoint.Resumed],
                outputs: RunOutputs) -> tuple[int, list[EpochRecord]]:
        if resumed is None:
            return 0, []
        job.backend.load(resumed.directory)  # every rank: the elastic sync needs no broadcast here
        return resumed_progress(resumed)

    def make_sinks(self, job: Job, ctx: Context, outputs: RunOutputs) -> list[Sink]:
        # The first rank 0's; after a reset they follow rank 0 (elastic.RankZeroWatchers).
        return make_sinks(job.config, job.backend_name, outputs) if ctx.is_main else []

    def start_watchdog(self, job: Job, ctx: Context) -> watchdog.Watchdog:
        # No collective before the elastic loop syncs: the heartbeats are wired by each attempt
        # (hvdcls.training.elastic), and a rank its watchdog ends is a failed worker.
        return watchdog.start(job.config.training.stall_timeout_seconds, ctx.rank, ctx.size, None,
                              elastic=True)

    def train(self, job: Job, ctx: Context, outputs: RunOutputs, monitor: Monitor,
              start_epoch: int, history: list[EpochRecord], dog: watchdog.Watchdog) -> Ended:
        # A Horovod shutdown here is elastic's to recover from, not a stall to report.
        # A process that becomes rank 0 later makes the watchers itself, and says so itself.
        rank_zero_outputs = RunOutputs(outputs.run_dir, enabled=True)

        def sinks(metrics):
            return make_sinks(job.config, job.backend_name, rank_zero_outputs, metrics, status_file.RESETTING)

        trainer, state, recoveries = elastic.run(job.config, job.backend, job.data,
                                                 outputs.run_dir, monitor, start_epoch, history, dog,
                                                 make_sinks=sinks,
                                                 stop_writer=lambda out, c: stop_writer(job, c, out))
        extra: dict[str, Any] = {"elastic": recoveries}
        if trainer.rebalancer is not None:  # every world's plans, from the state
            extra["balance"] = elastic.balance_summary(trainer, state)
        return Ended(trainer.ctx, trainer.outputs, state.history, extra)

    def details(self, summary: dict) -> str:
        recoveries = summary["elastic"]
        return f"({recoveries['resets']} reset(s), {recoveries['steps_lost']} step(s) lost)"


def resumed_progress(resumed: checkpoint.Resumed) -> tuple[int, list[EpochRecord]]:
    """(epochs done, their records) as the checkpoint's state.json holds them."""
    return resumed.state["epoch"], [EpochRecord.from_dict(r) for r in resumed.state["history"]]


@contextmanager
def bad_file_failures(data: Data):
    """data.bad_files=fail, met in a loader worker, reaches us wrapped by the loader (torch
    re-raises it with the worker's traceback, tf.data as its own error): give the one line."""
    try:
        yield
    except Exception as err:
        fatal = data.bad_files.fatal() if data.bad_files else None
        if fatal is None:
            raise
        raise UserError(fatal) from err


# What Horovod's collectives raise, in every binding, once its background thread has shut down.
HOROVOD_SHUT_DOWN = "Horovod has been shut down"


@contextmanager
def horovod_shutdown(ctx: Context, dog: watchdog.Watchdog):
    """A collective cut short by Horovod's shutdown, as one line naming this rank and, on rank
    0, the ranks whose heartbeats stopped. Under Gloo the usual cause is a peer that died or
    stopped answering (Gloo's receive timeout, 30 s by default); under MPI also Horovod's
    stall inspector, whose report just before ("Missing ranks: N!") names the rank."""
    try:
        yield
    except Exception as err:
        if HOROVOD_SHUT_DOWN not in str(err):
            raise
        raise JobStopped(shutdown_message(ctx, dog.blame())) from None


def shutdown_message(ctx: Context, silent: Optional[str]) -> str:
    if silent:  # rank 0, from the heartbeats: the ranks that went quiet
        cause = silent
    elif ctx.is_main:
        cause = "a rank failed (every rank's heartbeat was recent, or heartbeats were off)"
    else:
        cause = "a rank failed or stopped answering (rank 0's log names it from its heartbeats)"
    if ctx.controller == "mpi":
        cause += "; or Horovod's stall inspector stopped it (its report above: 'Missing ranks: N!')"
    return f"rank {ctx.rank}: Horovod shut the job down while this rank waited in a collective: {cause}"


def stop_writer(job: Job, ctx: Context, outputs: RunOutputs) -> Callable[[dict], None]:
    """The watchdog's last record for this world: rank 0's (`outputs` is enabled only there)."""
    return lambda stop: outputs.write_summary(stopped_summary(job, ctx, outputs, stop))


def stopped_summary(job: Job, ctx: Context, outputs: RunOutputs, stop: dict) -> dict:
    """summary.json when a watchdog ended the run: which rank stopped it, where, and how far
    the run got (rank 0 writes it; the closing summary needs collectives it cannot run)."""
    history = outputs.history
    return {"stopped": stop, "backend": ctx.backend, "world_size": ctx.size,
            "controller": ctx.controller, "epochs": job.config.training.epochs,
            "epochs_done": len(history),
            "val_accuracy": history[-1].val_accuracy if history else None,
            "wall_seconds": time.time() - job.started, "config": cfg.to_dict(job.config)}


def publish(summary: dict, outputs: RunOutputs, monitor: Monitor, details: str) -> None:
    """The run's end on rank 0: summary.json, the closing line, the watchers' last word."""
    outputs.write_summary(summary)
    outputs.say(f"done: val accuracy {summary['val_accuracy']:.4f} {details}, "
                f"{summary['wall_seconds']:.1f} s; outputs in {outputs.run_dir}")
    monitor.finish()


def make_sinks(config: cfg.Config, backend_name: str, outputs: RunOutputs,
               metrics: bool = True, phase: str = status_file.STARTING) -> list[Sink]:
    """Rank 0's watchers of the run: progress, status.json (from `phase`: a new rank 0 takes
    it over while the world resets), and as configured Prometheus (unless not `metrics`),
    TensorBoard, report.png and MLflow (hvdcls.observe.monitor). Imported here, on rank 0, only when
    wanted."""
    from hvdcls.observe.progress import Progress, choose_mode
    from hvdcls.observe.status import StatusSink

    out = config.output
    sinks: list[Sink] = [Progress(choose_mode(out.progress, sys.stdout), config.training.log_every)]
    endpoint = None
    if metrics and out.metrics_port is not None:
        from hvdcls.observe.prometheus import PrometheusSink

        exporter = PrometheusSink(out.metrics_port, out.metrics_host,
                                  {"backend": backend_name, "model": config.model.name},
                                  out.metrics_linger_seconds)
        endpoint = f"{reachable(out.metrics_host)}:{exporter.port}"
        outputs.say(f"metrics: Prometheus endpoint on http://{endpoint}/metrics")
        sinks.append(exporter)
    sinks.append(StatusSink(outputs.run_dir, backend_name, endpoint, phase=phase))
    if out.tensorboard:
        from hvdcls.observe.tensorboard import TensorBoardSink

        sinks.append(TensorBoardSink(outputs.run_dir / "tensorboard"))
    if out.report:
        from hvdcls.observe.report import ReportSink

        sinks.append(ReportSink(outputs.run_dir))
    if out.mlflow_uri:  # last: at the end it uploads what the sinks above wrote
        from hvdcls.observe.tracking import MlflowSink

        sinks.append(MlflowSink(out.mlflow_uri, out.mlflow_experiment, cfg.to_dict(config), outputs.run_dir))
    return sinks


def check_controller(config: cfg.Config, ctx: Context) -> None:
    """What Horovod can only do with some controllers; every rank decides alike, so all stop."""
    if config.horovod.op == "adasum" and ctx.size > 1 and ctx.controller != "mpi":
        raise UserError("horovod.op=adasum needs the MPI controller (mpirun, or horovodrun --mpi): "
                        "Horovod has no Adasum over Gloo on CPUs")


def with_rank_facts(summary: dict, backend: Backend) -> dict:
    """`summary` plus every rank's model digest and host (collectives: every rank calls this)."""
    summary["rank_weight_digests"] = rank_weight_digests(backend)
    if summary["config"]["training"]["ema_decay"] is not None:  # the EMA copy agrees too
        with backend.ema_weights():
            summary["rank_ema_digests"] = rank_weight_digests(backend)
    summary["rank_hosts"] = backend.allgather_object(socket.gethostname(), "rank_hosts")
    return summary


def rank_weight_digests(backend: Backend) -> list[str]:
    """Every rank's model digest, in rank order: one distinct value means the ranks agree."""
    return backend.allgather_object(weights_digest(backend.weights()), "weight_digests")


def evaluate_only(trainer: Trainer, backend: Backend, ctx: Context,
                  resumed: checkpoint.Resumed, outputs: RunOutputs) -> dict:
    """--eval-only: the checkpoint's model weights over the validation split, sharded over the
    ranks and reduced exactly; evaluation.json as `hvdcls evaluate` writes it, with the launch's
    own keys (backend, world_size, checkpoint, epoch, val_loss, val_accuracy, val_images)."""
    val = trainer.evaluate()
    result = {"backend": ctx.backend, "world_size": ctx.size, "checkpoint": str(resumed.directory),
              "epoch": resumed.state["epoch"], "val_loss": val.loss, "val_accuracy": val.accuracy,
              "val_images": val.count}
    trainer.write_evaluation(val, "model", resumed.state["epoch"], result)
    outputs.say(f"evaluated {resumed.directory}: val loss {val.loss:.4f} acc {val.accuracy:.4f} "
                f"on {val.count} images ({ctx.size} process(es)) -> {outputs.run_dir / EVALUATION_FILE}")
    return result


def make_summary(config: cfg.Config, ctx: Context, data: Data, model_info: dict,
                 horovod_settings: dict, history: list[EpochRecord], started: float,
                 resumed: Optional[checkpoint.Resumed]) -> dict:
    this_run = [r for r in history if r.epoch > (resumed.state["epoch"] if resumed else 0)]
    images = sum(r.train_images for r in this_run)
    seconds = sum(r.train_seconds for r in this_run)
    return {
        "backend": ctx.backend, "world_size": ctx.size, "controller": ctx.controller,
        "model": config.model.name, "dataset": data.name, "data": data.description,
        "augment": data.augment, "num_classes": data.num_classes, "epochs": config.training.epochs,
        "val_accuracy": history[-1].val_accuracy if history else None,
        "best_val_accuracy": max((r.val_accuracy for r in history), default=None),
        "ema_val_accuracy": history[-1].ema_val_accuracy if history else None,
        "val_loss": history[-1].val_loss if history else None,
        "images_per_sec": images / seconds if seconds else None,
        "wall_seconds": time.time() - started,
        **target_facts(config.training.target_accuracy, history, started),
        "resumed_from": str(resumed.directory) if resumed else None,
        "device": ctx.device, "threads_per_process": ctx.threads,
        "allocator": allocator.loaded(),
        "model_info": model_info,
        "horovod": {**model_info.get("horovod", {}), "environment": horovod_settings},
        "versions": {"hvdcls": __version__, "python": platform.python_version(), **ctx.versions},
        "config": cfg.to_dict(config),
    }


def target_facts(target: Optional[float], history: list[EpochRecord], started: float) -> dict:
    """training.target_accuracy's outcome: the first epoch that met it (None: none did) and the
    seconds from this process's start to the end of that epoch's evaluation."""
    hit = next((r for r in history if target is not None and r.val_accuracy >= target), None)
    return {"target_accuracy": target, "reached_target_epoch": hit.epoch if hit else None,
            "seconds_to_target": hit.wall_time - started if hit and hit.wall_time else None}


def run(backend_name: str, config_file: Optional[Path], overrides: list[str], flags: dict) -> int:
    registry.get(backend_name)
    train(cfg.load(config_file, overrides, flags), backend_name)
    return 0


def reachable(listen_host: str) -> str:
    """The host to name in rank 0's endpoint line: listening on every address, this host's
    name (what a Prometheus elsewhere, or `hvdcls serve`'s /targets, can reach), else the
    address itself."""
    return socket.gethostname() if listen_host in ("0.0.0.0", "::", "") else listen_host
