"""Run one or several policies over a trace and a cluster: in this process, over a process pool, or on Ray."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import polars as pl

from gpufleet.errors import ConfigError
from gpufleet.sched.placement.base import available_placements
from gpufleet.sched.policy import available_policies, make_policy, make_scheduler, split_label
from gpufleet.sim.config import SimConfig
from gpufleet.sim.engine import Simulator
from gpufleet.sim.features.base import Feature
from gpufleet.sim.features.inference import InferenceUsage, PoolGPUs
from gpufleet.sim.network import network_for_run
from gpufleet.sim.result import SimResult
from gpufleet.sim.workload import Workload, partitions_for

#: The policies ``gpufleet simulate`` compares when none are named.
BASELINE_POLICIES = ("fifo", "sjf", "srtf", "las", "tiresias")


@dataclass(frozen=True)
class RunSpec:
    """Everything one worker needs to run one policy: picklable, so it travels to processes and Ray.

    ``policy`` is a run label: a policy name (with its default placement) or ``policy+placement``."""

    policy: str
    jobs: pl.DataFrame
    cluster: Any  # gpufleet.spec.ClusterSpec
    config: SimConfig = field(default_factory=SimConfig)
    policy_opts: Mapping[str, Any] = field(default_factory=dict)
    inference: Any = None  # gpufleet.traces.inference.InferenceLoad: the inference pool's demand over time
    elastic: Any = None  # gpufleet.sim.elastic_jobs.ElasticConfig for the Aryl family (None: defaults)
    placement_opts: Mapping[str, Any] = field(default_factory=dict)  # options of the label's placement


def label_opts(label: str, opts: Mapping[str, Mapping[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(policy options, placement options) of run ``label`` from options keyed by policy and placement name.

    A placement takes the options of its name that it knows (``contention.wait_below`` set for the ``contention``
    alias policy also sets the ``contention`` placement's)."""
    name, placement = split_label(label)
    popts = dict(opts.get(name, {}))
    if placement is None:
        return popts, {}
    known = available_placements()[placement].options if placement in available_placements() else {}
    return popts, {k: v for k, v in opts.get(placement, {}).items() if k in known}


def finish_labels(result: SimResult, label: str, policy: Any) -> SimResult:
    """Name the run ``label`` and record its policy and placement in the summary."""
    result.policy = label
    result.summary["placement"] = policy.placement
    return result


def run_one(spec: RunSpec) -> SimResult:
    """Simulate one (policy, placement) run; the building block of every sweep."""
    policy = make_scheduler(spec.policy, spec.policy_opts, spec.placement_opts)
    return finish_labels(_simulate(spec, policy), spec.policy, policy)


def _simulate(spec: RunSpec, policy: Any) -> SimResult:
    if policy.engine == "elastic":
        from gpufleet.sim.elastic import ElasticSimulator

        return ElasticSimulator(
            spec.jobs,
            spec.cluster,
            policy,
            spec.config,  # type: ignore[arg-type]
            spec.elastic,
            spec.inference,
        ).run()
    parts = partitions_for(spec.cluster)
    network = network_for_run(spec.cluster, parts, spec.jobs, spec.config)
    features: list[Feature] = []
    if spec.inference is not None and spec.cluster.inference_pools:
        features.append(InferenceUsage(spec.inference, PoolGPUs.of(spec.cluster)))
    sim = Simulator(Workload.from_frame(spec.jobs), parts, policy, spec.config, network=network, features=features)
    return sim.run()


def _qualify(items: Sequence[str], policies: Sequence[str], known: Mapping[str, Any]) -> list[str]:
    """Expand each bare ``KEY=VALUE`` into ``POLICY.KEY=VALUE`` for every chosen policy that has option KEY."""
    out: list[str] = []
    for item in items:
        name, sep, _ = item.partition("=")
        if not sep or "." in name or not name:
            out.append(item)
            continue
        owners = [p for p in policies if p in known and name in known[p].options]
        if not owners:
            raise ConfigError(
                f"--opt '{item}': none of the chosen policies ({', '.join(policies)}) has an option "
                f"'{name}'; use POLICY.OPTION=VALUE"
            )
        out.extend(f"{owner}.{item}" for owner in owners)
    return out


def parse_policy_opts(items: Sequence[str], policies: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Turn ``["tiresias.thresholds=3600,36000", "las.quantum_gpu_s=600"]`` into per-policy option dicts."""
    known: dict[str, Any] = {**available_placements(), **available_policies()}
    out: dict[str, dict[str, Any]] = {p: {} for p in policies}
    for item in _qualify(items, policies, known):
        name, sep, value = item.partition("=")
        pol, dot, key = name.partition(".")
        if not sep or not dot or not key:
            raise ConfigError(f"--opt '{item}' must look like POLICY.OPTION=VALUE, e.g. las.quantum_gpu_s=600")
        if pol not in known:
            raise ConfigError(
                f"--opt '{item}': unknown policy or placement '{pol}' (available: {', '.join(sorted(known))})"
            )
        default = known[pol].options.get(key)
        if isinstance(default, float):
            try:
                parsed: Any = float(value)
            except ValueError as exc:
                raise ConfigError(f"--opt '{item}': {key} needs a number, got '{value}'") from exc
        else:
            parsed = value
        out.setdefault(pol, {})[key] = parsed
    for pol, opts in out.items():
        if pol in policies and pol in available_policies():
            make_policy(pol, **opts)  # validates option names and values before any worker starts
    return out


def pair_runs(policies: Sequence[str], placements: Sequence[str] | None) -> list[str]:
    """The run labels covering every (policy, placement) pair, policy-major (None: each policy's default)."""
    from gpufleet.sched.policy import pair_label

    if not placements:
        return list(policies)
    out: list[str] = []
    for p in policies:
        for pl_name in placements:
            label = pair_label(p, pl_name)
            if label not in out:
                out.append(label)
    return out


def run_policies(
    jobs: pl.DataFrame,
    cluster: Any,
    policies: Sequence[str],
    config: SimConfig | None = None,
    policy_opts: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    workers: int | None = None,
    ray_address: str | None = None,
    on_done: Callable[[SimResult], None] | None = None,
    inference: Any = None,
    elastic: Any = None,
) -> list[SimResult]:
    """Simulate each policy over the same jobs and cluster; results come back in the order of ``policies``.

    Each entry of ``policies`` is a run label, a policy or a ``policy+placement`` pair (:func:`pair_runs`);
    ``policy_opts`` is keyed by policy and placement names.

    ``workers`` > 1 fans the runs out over a process pool; ``ray_address`` ("local" or a cluster address)
    runs them as Ray tasks instead. Each run is deterministic, so the results do not depend on where it ran.
    """
    config = config or SimConfig()
    policy_opts = policy_opts or {}
    for name in policies:
        make_scheduler(name, *label_opts(name, policy_opts))  # fail fast on a bad name, pair or option
    if ray_address is None and (workers is None or workers <= 1 or len(policies) == 1):
        results = []
        for name in policies:
            popts, plopts = label_opts(name, policy_opts)
            results.append(run_one(RunSpec(name, jobs, cluster, config, popts, inference, elastic, plopts)))
            if on_done:
                on_done(results[-1])
        return results
    # progress bars from several processes would garble the terminal: the caller reports completions
    quiet = replace(config, progress=False)
    specs = []
    for p in policies:
        popts, plopts = label_opts(p, policy_opts)
        specs.append(RunSpec(p, jobs, cluster, quiet, popts, inference, elastic, plopts))
    if ray_address is None:
        return _run_pool(specs, workers or 1, on_done)
    results = _run_ray(specs, ray_address)
    if on_done:
        for r in results:
            on_done(r)
    return results


def _run_pool(specs: list[RunSpec], workers: int, on_done: Callable[[SimResult], None] | None) -> list[SimResult]:
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from multiprocessing import get_context

    out: list[SimResult | None] = [None] * len(specs)
    workers = min(workers, len(specs), os.cpu_count() or 1)
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(run_one, s): i for i, s in enumerate(specs)}
        for fut in as_completed(futures):
            out[futures[fut]] = fut.result()
            if on_done:
                on_done(out[futures[fut]])  # type: ignore[arg-type]
    return [r for r in out if r is not None]


def _run_ray(specs: list[RunSpec], address: str) -> list[SimResult]:
    try:
        import ray
    except ImportError as exc:
        raise ConfigError("--ray needs Ray: pip install 'gpufleet[ray]'") from exc

    started = False
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if address == "local":
            ray.init(**kwargs)
        else:
            ray.init(address=address, **kwargs)
        started = True
    try:
        remote = ray.remote(run_one)
        return list(ray.get([remote.remote(s) for s in specs]))
    finally:
        if started:
            ray.shutdown()
