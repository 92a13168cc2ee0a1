"""``python -m gpufleet.meta.worker TASKS``: the training entry point, one process per rank under ``torchrun``.

Run alone it trains in one process; under ``torchrun --nproc-per-node N`` every process joins the gloo (CPU)
or NCCL (GPU) group from torchrun's environment, and the embedding table is sharded over the N ranks.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from gpufleet.errors import GpufleetError


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v.strip())


def build_parser() -> argparse.ArgumentParser:
    """The trainer's flags (also used by ``gpufleet meta train``)."""
    p = argparse.ArgumentParser(
        prog="python -m gpufleet.meta.worker",
        description="Meta-train a DLRM / MeLU recommender on prepared tasks (G-Meta style).",
    )
    p.add_argument("tasks", type=Path, help="folder written by `gpufleet meta prepare`")
    p.add_argument("-o", "--output", type=Path, default=Path("model.pt"), help="exported model file")
    p.add_argument("--model", default="dlrm", choices=["dlrm", "melu"])
    p.add_argument(
        "--trainer",
        default="gmeta",
        choices=["gmeta", "naive"],
        help="gmeta: sharded table, whole-task batches, one all-reduce per step; naive: the DMAML-style "
        "baseline (full tables, per-sample loader, per-task loop and all-reduce)",
    )
    p.add_argument(
        "--maml",
        default="first-order",
        choices=["first-order", "second-order", "meta-sgd", "none"],
        help="first-order (FOMAML), second-order (through the inner update), meta-sgd (first order with a learned "
        "inner rate per adapted weight), or none (plain model)",
    )
    p.add_argument(
        "--adapt",
        default="all",
        choices=["all", "decision", "last"],
        help="what the inner loop adapts: every layer, the decision layers only (MeLU), or the last layer; the "
        "rest is shared",
    )
    p.add_argument(
        "--memory", type=int, default=0, help="task memory width (TaNP/MAMO-style support-set encoder); 0 = none"
    )
    p.add_argument(
        "--support-weight",
        type=float,
        default=0.5,
        help="weight of the un-adapted model's support loss in the outer loss (the shared layers also learn "
        "from the support samples)",
    )
    p.add_argument("--epochs", type=int, default=30, help="most passes over the training tasks")
    p.add_argument(
        "--patience",
        type=int,
        default=3,
        help="stop after this many epochs without a better validation score and keep the best epoch (0 = off)",
    )
    p.add_argument(
        "--select", default="mean", choices=["auc", "gauc", "mean"], help="validation score: AUC, GAUC or their mean"
    )
    p.add_argument(
        "--grid",
        default=None,
        help="choose settings on the validation tasks, e.g. 'inner_lr=0.03,0.1,0.3;inner_steps=1,2'; the best "
        "point's model is written to -o",
    )
    p.add_argument("--tasks-per-step", type=int, default=32, help="tasks per meta-step over ALL ranks")
    p.add_argument("--inner-lr", type=float, default=0.1)
    p.add_argument("--inner-steps", type=int, default=1)
    p.add_argument("--adapt-embeddings", action="store_true", help="also adapt the looked-up rows per task")
    p.add_argument("--outer-lr", type=float, default=2e-3, help="Adam learning rate of the dense layers")
    p.add_argument("--emb-lr", type=float, default=0.05, help="Adagrad learning rate of the embedding rows")
    p.add_argument("--emb-dim", type=int, default=16)
    p.add_argument("--bottom", type=_ints, default=(64,), help="bottom MLP widths, e.g. 64,32")
    p.add_argument("--top", type=_ints, default=(64, 32), help="top MLP widths")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many meta-steps")
    p.add_argument("--checkpoint-dir", type=Path, default=None)
    p.add_argument("--checkpoint-every", type=int, default=50, help="meta-steps between checkpoints")
    p.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    p.add_argument("--stats", type=Path, default=None, help="write measured figures (JSON) here")
    p.add_argument("--threads", type=int, default=None, help="torch threads per rank (default: cores / ranks)")
    p.add_argument("--die-at-step", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--die-rank", type=int, default=0, help=argparse.SUPPRESS)
    return p


def config_from_args(args: argparse.Namespace):
    """Parsed flags -> TrainConfig."""
    from gpufleet.meta.trainer import TrainConfig

    order = {"first-order": "first", "second-order": "second", "meta-sgd": "first", "none": "none"}[args.maml]
    return TrainConfig(
        tasks=args.tasks,
        output=args.output,
        model=args.model,
        emb_dim=args.emb_dim,
        bottom=args.bottom,
        top=args.top,
        order=order,
        inner_lr=args.inner_lr,
        inner_steps=args.inner_steps,
        adapt_embeddings=args.adapt_embeddings,
        support_weight=args.support_weight,
        adapt=args.adapt,
        learned_rates=args.maml == "meta-sgd",
        memory=args.memory,
        epochs=args.epochs,
        patience=args.patience or None,
        select=args.select,
        tasks_per_step=args.tasks_per_step,
        outer_lr=args.outer_lr,
        emb_lr=args.emb_lr,
        seed=args.seed,
        max_steps=args.max_steps,
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every,
        resume=args.resume,
        die_at_step=args.die_at_step,
        die_rank=args.die_rank,
        progress=sys.stderr.isatty(),
    )


def init_distributed() -> None:
    """Join torchrun's process group (gloo on CPU, NCCL when every rank has a GPU); nothing when run alone."""
    import torch
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend=backend)


def _run_grid(args: argparse.Namespace, config) -> int:
    """Train every grid point on all ranks (each a collective run), keep the best on validation, export it."""
    import dataclasses

    from gpufleet.meta.trainer import MetaTrainer
    from gpufleet.meta.tune import grid_points, parse_grid

    if args.trainer != "gmeta":
        raise GpufleetError("--grid runs the gmeta trainer; drop --trainer naive")
    if not config.patience:
        raise GpufleetError("--grid is chosen on the validation tasks: it needs --patience >= 1")
    best_score, rows = float("-inf"), []
    for settings in grid_points(parse_grid(args.grid)):
        trainer = MetaTrainer(dataclasses.replace(config, **settings))
        stats = trainer.fit()
        rows.append((settings, stats.best_score, stats.best_epoch))
        if stats.best_score > best_score:
            best_score = stats.best_score
            if args.output is not None:
                trainer.export(args.output)
        if trainer.rank == 0:
            print(f"{settings}: validation {stats.best_score:.4f} (epoch {stats.best_epoch})", file=sys.stderr)
    best = max(rows, key=lambda r: r[1])
    if trainer.rank == 0:
        print(f"best on validation: {best[0]} ({best[1]:.4f}); model -> {args.output}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        import torch
    except ImportError:
        print("error: training needs PyTorch; install the extra: pip install 'gpufleet[torch]'", file=sys.stderr)
        return 2
    world = int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // world))
    try:
        init_distributed()
        from gpufleet.meta.trainer import MetaTrainer, gather_stats, write_stats

        config = config_from_args(args)
        if args.grid is not None:
            return _run_grid(args, config)
        if args.trainer == "naive":
            from gpufleet.meta.naive import NaiveTrainer

            trainer: MetaTrainer = NaiveTrainer(config)
        else:
            trainer = MetaTrainer(config)
        stats = trainer.fit()
        everyone = gather_stats(stats)
        if args.output is not None:
            trainer.export(args.output)
        if trainer.rank == 0 and args.stats is not None:
            write_stats(args.stats, config, everyone)
        if trainer.rank == 0:
            print(
                f"trained {trainer.step} meta-steps on {trainer.world} rank(s); model -> {args.output}", file=sys.stderr
            )
    except GpufleetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
