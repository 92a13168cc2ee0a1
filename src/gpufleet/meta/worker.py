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
        choices=["first-order", "second-order", "none"],
        help="first-order (FOMAML), second-order (through the inner update), or none (plain model)",
    )
    p.add_argument(
        "--epochs", type=int, default=3, help="passes over the training tasks (MovieLens-100k overfits past about 5)"
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

    order = {"first-order": "first", "second-order": "second", "none": "none"}[args.maml]
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
        epochs=args.epochs,
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
