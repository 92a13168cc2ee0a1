"""Synthetic training-job traces whose default statistics are fitted to the Microsoft Philly trace.

Used to scale studies beyond the public traces (e.g. a million jobs on a 100,000-GPU cluster) while
keeping Philly's job-size mix, duration spread and daily/weekly arrival rhythm. Everything is
vectorised NumPy driven by ``np.random.default_rng(seed)``: the same arguments give the same frame.

Every default below was measured on the bundled Philly trace (``load_trace("philly")``: 82,247
jobs, first submit 2017-09-04 10:30:41, last 2017-12-22 08:02:11); ``tests/traces`` re-derives them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

import numpy as np
import polars as pl

from gpufleet.errors import TraceError
from gpufleet.traces.load import TraceLoad, load_trace
from gpufleet.traces.schema import KINDS, jobs_from_arrays

#: Philly: number of jobs and the span from first to last submit (108 d 21 h 31 m 30 s).
PHILLY_JOBS = 82_247
PHILLY_SPAN_DAYS = 108.896875
#: Default arrival rate: Philly's 82,247 jobs over 108.9 days = 31.47 jobs per hour.
PHILLY_RATE_PER_HOUR = PHILLY_JOBS / (PHILLY_SPAN_DAYS * 24.0)

#: Default GPU mix: Philly's job count per GPU request (sums to 82,247; mean 1.3038 GPUs per job).
#: 12 and 24 GPUs occur 7 times each and are kept so that the mix is exactly Philly's.
PHILLY_GPU_MIX: dict[int, int] = {
    1: 76_627,
    2: 1_818,
    4: 1_870,
    8: 1_643,
    12: 7,
    16: 199,
    24: 7,
    32: 67,
    64: 6,
    128: 3,
}

#: Lognormal duration: maximum-likelihood fit to Philly, i.e. mean and (population, ddof=0) standard
#: deviation of ln(duration_s) over all 82,247 jobs: mu = 6.790906, sigma = 2.155537.
#: Median exp(mu) = 890 s (Philly's empirical median is 1,144 s; p90 14,092 s vs 11,265 s).
LOGNORMAL_MU = 6.790906
LOGNORMAL_SIGMA = 2.155537

#: Pareto (type II / Lomax) duration: maximum-likelihood fit to Philly's durations with
#: ``scipy.stats.lomax.fit(durations, floc=0)``: shape 0.626662, scale 378.4379 s (median 765 s).
#: Shape < 1 means an infinite mean, so samples are clipped to Philly's duration range below.
PARETO_SHAPE = 0.626662
PARETO_SCALE_S = 378.4379

#: Samples are clipped to Philly's observed duration range: 1 s to 4,628,226 s (53.6 days).
MIN_DURATION_S = 1.0
MAX_DURATION_S = 4_628_226.0

#: Philly's longest job ran 4,628,226 s of its 108.9-day submit window: 0.4919 of it. With a target load
#: the generator keeps that ratio: no duration exceeds this share of the arrival window (see plan_load).
MAX_WINDOW_SHARE = MAX_DURATION_S / (PHILLY_SPAN_DAYS * 86_400.0)

ARRIVALS = ("poisson", "fitted")
DURATION_DISTS = ("lognormal", "pareto")
_HOUR = 3600.0


def _normal_cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def mean_duration_s(
    duration_dist: str = "lognormal",
    *,
    duration_mu: float = LOGNORMAL_MU,
    duration_sigma: float = LOGNORMAL_SIGMA,
    pareto_shape: float = PARETO_SHAPE,
    pareto_scale_s: float = PARETO_SCALE_S,
    min_duration_s: float = MIN_DURATION_S,
    max_duration_s: float = MAX_DURATION_S,
) -> float:
    """Exact mean of the generator's (clipped) duration distribution, in seconds.

    With the defaults: lognormal about 8,932 s, Pareto about 33,019 s (Philly's mean is 13,136 s).
    """
    a, b = min_duration_s, max_duration_s
    if duration_dist == "lognormal":
        mu, s = duration_mu, duration_sigma
        za, zb = (math.log(a) - mu) / s, (math.log(b) - mu) / s
        partial = math.exp(mu + s * s / 2.0) * (_normal_cdf(zb - s) - _normal_cdf(za - s))
        return a * _normal_cdf(za) + partial + b * (1.0 - _normal_cdf(zb))
    if duration_dist == "pareto":
        # E[clip(X, a, b)] = a + integral_a^b P(X > x) dx, with P(X > x) = (1 + x/scale)^-shape.
        k, lam = pareto_shape, pareto_scale_s
        if abs(k - 1.0) < 1e-12:
            return a + lam * math.log((lam + b) / (lam + a))
        return a + lam / (1.0 - k) * ((1.0 + b / lam) ** (1.0 - k) - (1.0 + a / lam) ** (1.0 - k))
    raise TraceError(f"unknown duration_dist '{duration_dist}'; use one of: {', '.join(DURATION_DISTS)}")


def _mix_arrays(gpu_mix: Mapping[int, float] | None) -> tuple[np.ndarray, np.ndarray]:
    """GPU sizes and their probabilities from a {num_gpus: weight} mapping (weights need not sum to 1)."""
    mix = PHILLY_GPU_MIX if gpu_mix is None else gpu_mix
    if not mix:
        raise TraceError("gpu_mix is empty; give {num_gpus: weight}, e.g. {1: 0.9, 8: 0.1}")
    sizes = np.array(list(mix.keys()))
    weights = np.array(list(mix.values()), dtype=float)
    if sizes.dtype.kind not in "iu" or (sizes <= 0).any() or (sizes > 2**31 - 1).any():
        raise TraceError(f"gpu_mix keys must be positive whole GPU counts, got {sorted(mix)}")
    if not np.isfinite(weights).all() or (weights < 0).any() or weights.sum() <= 0:
        raise TraceError("gpu_mix weights must be finite, non-negative and not all zero")
    return sizes.astype(np.int32), weights / weights.sum()


def rate_for_load(
    target_busy_gpus: float,
    gpu_mix: Mapping[int, float] | None = None,
    mean_duration: float | None = None,
) -> float:
    """Arrival rate (jobs per hour) at which jobs keep ``target_busy_gpus`` GPUs busy on average.

    Little's law: busy GPUs = rate x E[num_gpus] x E[duration_s] (size and duration independent, as
    in the generator). ``mean_duration`` is in seconds; None = the default lognormal's mean. E.g.
    80% of a 100,000-GPU cluster: ``rate_for_load(80_000)`` = about 24,700 jobs per hour.
    """
    if not (math.isfinite(target_busy_gpus) and target_busy_gpus > 0):
        raise TraceError(f"target_busy_gpus must be a positive number, got {target_busy_gpus}")
    sizes, probs = _mix_arrays(gpu_mix)
    mean_gpus = float((sizes * probs).sum())
    duration = mean_duration_s() if mean_duration is None else float(mean_duration)
    if not (math.isfinite(duration) and duration > 0):
        raise TraceError(f"mean_duration must be a positive number of seconds, got {mean_duration}")
    return target_busy_gpus / (mean_gpus * duration) * _HOUR


def _power_integral(p: float, y0: float, y1: float) -> float:
    """Integral of y**p from y0 to y1."""
    if abs(p + 1.0) < 1e-12:
        return math.log(y1 / y0)
    return (y1 ** (p + 1.0) - y0 ** (p + 1.0)) / (p + 1.0)


def _bounded_moment(
    k: int,
    bound: float,
    duration_dist: str,
    *,
    duration_mu: float,
    duration_sigma: float,
    pareto_shape: float,
    pareto_scale_s: float,
    min_duration_s: float,
) -> float:
    """E[max(X, min)^k | X <= bound] for k in (1, 2): the moments of the durations drawn under a load plan."""
    a, b = min_duration_s, bound
    if duration_dist == "lognormal":
        mu, s = duration_mu, duration_sigma
        za, zb = (math.log(a) - mu) / s, (math.log(b) - mu) / s
        below, inside = _normal_cdf(za), _normal_cdf(zb)
        part = math.exp(k * mu + k * k * s * s / 2.0) * (_normal_cdf(zb - k * s) - _normal_cdf(za - k * s))
    else:
        # Lomax density shape/scale * y**-(shape+1) with y = 1 + x/scale; x = scale * (y - 1).
        sh, lam = pareto_shape, pareto_scale_s
        ya, yb = 1.0 + a / lam, 1.0 + b / lam
        below, inside = 1.0 - ya**-sh, 1.0 - yb**-sh
        if k == 1:
            part = lam * sh * (_power_integral(-sh, ya, yb) - _power_integral(-sh - 1.0, ya, yb))
        else:
            terms = _power_integral(1.0 - sh, ya, yb) - 2.0 * _power_integral(-sh, ya, yb)
            part = lam * lam * sh * (terms + _power_integral(-sh - 1.0, ya, yb))
    return (a**k * below + part) / inside


@dataclass(frozen=True)
class LoadPlan:
    """How a target load is met: arrival rate, expected arrival window and the bound on durations."""

    rate_per_hour: float
    window_s: float  # expected span from the first to the last submit (n_jobs / rate)
    max_duration_s: float  # no duration exceeds this: window_share x window_s (or the clip, if lower)
    mean_duration_s: float  # mean of the bounded durations
    steady_busy_gpus: float  # busy GPUs once warm (after max_duration_s), above the window's mean by the ramp


def plan_load(
    n_jobs: int,
    target_busy_gpus: float,
    gpu_mix: Mapping[int, float] | None = None,
    duration_dist: str = "lognormal",
    *,
    window_share: float = MAX_WINDOW_SHARE,
    duration_mu: float = LOGNORMAL_MU,
    duration_sigma: float = LOGNORMAL_SIGMA,
    pareto_shape: float = PARETO_SHAPE,
    pareto_scale_s: float = PARETO_SCALE_S,
    min_duration_s: float = MIN_DURATION_S,
    max_duration_s: float = MAX_DURATION_S,
) -> LoadPlan:
    """Rate and duration bound at which ``n_jobs`` keep ``target_busy_gpus`` busy on average over their window.

    Durations are drawn from the distribution conditioned on ``X <= window_share x window`` (a resample of
    the tail, not a clip), so that the work lands inside the window. The window T solves
    ``n x E[num_gpus] x (E[D] - E[D^2] / (2T)) = target x T``: the GPU-time inside [0, T] of jobs submitted
    uniformly over it and started at once (the second term is the work that spills past T). Raises
    TraceError when even durations bounded at the distribution's median cannot fill the window.
    """
    if not (math.isfinite(target_busy_gpus) and target_busy_gpus > 0):
        raise TraceError(f"target_busy_gpus must be a positive number, got {target_busy_gpus}")
    if not (math.isfinite(window_share) and 0 < window_share <= 1):
        raise TraceError(f"window_share must be in (0, 1], got {window_share}")
    if duration_dist not in DURATION_DISTS:
        raise TraceError(f"unknown duration_dist '{duration_dist}'; use one of: {', '.join(DURATION_DISTS)}")
    sizes, probs = _mix_arrays(gpu_mix)
    mean_gpus = float((sizes * probs).sum())
    args = dict(
        duration_mu=duration_mu,
        duration_sigma=duration_sigma,
        pareto_shape=pareto_shape,
        pareto_scale_s=pareto_scale_s,
        min_duration_s=min_duration_s,
    )

    def bound_at(window: float) -> float:
        return min(max(window_share * window, min_duration_s), max_duration_s)

    def load_at(window: float) -> float:  # busy GPUs over [0, window]; decreases as the window grows
        b = bound_at(window)
        m1 = _bounded_moment(1, b, duration_dist, **args)
        m2 = _bounded_moment(2, b, duration_dist, **args)
        return n_jobs * mean_gpus * (m1 - m2 / (2.0 * window)) / window

    if duration_dist == "lognormal":
        median = math.exp(duration_mu)
    else:
        median = pareto_scale_s * (2.0 ** (1.0 / pareto_shape) - 1.0)
    median = min(max(median, min_duration_s), max_duration_s)
    lo = median / window_share
    if n_jobs <= 0 or load_at(lo) < target_busy_gpus:
        need = math.ceil(n_jobs * target_busy_gpus / load_at(lo)) if n_jobs > 0 else 2
        raise TraceError(
            f"{n_jobs:,} jobs cannot keep {target_busy_gpus:,.0f} GPUs busy over their arrival window without "
            f"cutting durations below the median ({median:,.0f} s); generate at least {need:,} jobs or ask for "
            "a lower load"
        )
    hi = 2.0 * lo
    while load_at(hi) > target_busy_gpus:
        hi *= 2.0
    for _ in range(100):  # bisection in log space: relative precision far below 1e-9
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if load_at(mid) > target_busy_gpus else (lo, mid)
    window = math.sqrt(lo * hi)
    bound = bound_at(window)
    mean = _bounded_moment(1, bound, duration_dist, **args)
    rate_s = n_jobs / window
    return LoadPlan(rate_s * _HOUR, window, bound, mean, rate_s * mean_gpus * mean)


def window_load(jobs: pl.DataFrame, gpus: float) -> float:
    """Offered load over the arrival window: GPU-time inside [first, last submit] of jobs started at submit.

    This is what a run's ``util_window`` would be on a cluster that never queues; ``plan_load`` targets it.
    """
    if jobs.height < 2 or gpus <= 0:
        return 0.0
    submit = jobs["submit_s"].to_numpy()
    first, last = float(submit.min()), float(submit.max())
    if last <= first:
        return 0.0
    inside = np.minimum(jobs["duration_s"].to_numpy(), last - submit)
    return float((inside * jobs["num_gpus"].to_numpy()).sum()) / (gpus * (last - first))


def arrival_profile(
    trace: pl.DataFrame | TraceLoad,
    *,
    origin: datetime | None = None,
    weekly: bool = True,
) -> tuple[np.ndarray, float]:
    """Relative arrival rate per hour of the week (168 values, or 24 per hour of day) and the mean rate.

    Rates are submits per slot divided by the hours of that slot the trace covers, normalised to a
    mean of 1; slots the trace never covers get the mean. ``origin`` (or the TraceLoad's) gives the
    clock; without one, submit_s = 0 is taken as Monday 00:00. Slot 0 is Monday 00:00-01:00.
    """
    if isinstance(trace, TraceLoad):
        origin = origin if origin is not None else trace.origin
        trace = trace.jobs
    if "submit_s" not in trace.columns:
        raise TraceError("fit: the frame has no submit_s column; pass a canonical trace (load_trace)")
    submit = trace["submit_s"].drop_nulls().drop_nans().to_numpy().astype(float)
    if submit.size < 2 or submit.max() <= submit.min():
        raise TraceError("fit: need at least two jobs with different submit_s to fit an arrival profile")
    slots = 168 if weekly else 24
    period = slots * _HOUR
    phase = 0.0
    if origin is not None:
        since_monday = origin.weekday() * 86400.0 if weekly else 0.0
        phase = since_monday + origin.hour * _HOUR + origin.minute * 60.0 + origin.second + origin.microsecond / 1e6
    t = submit + phase
    counts = np.bincount(((t % period) // _HOUR).astype(np.int64) % slots, minlength=slots).astype(float)
    # Exposure: hours of each slot between the first and last submit (partial hours counted).
    t0, t1 = float(t.min()), float(t.max())
    edges = np.arange(math.floor(t0 / _HOUR), math.ceil(t1 / _HOUR) + 1) * _HOUR
    clipped = np.clip(edges, t0, t1)
    exposure = np.bincount(
        (edges[:-1] // _HOUR).astype(np.int64) % slots, weights=np.diff(clipped) / _HOUR, minlength=slots
    )
    mean_rate = submit.size / ((t1 - t0) / _HOUR)
    rate = np.where(exposure > 0, counts / np.maximum(exposure, 1e-12), mean_rate)
    return rate / rate.mean(), mean_rate


@lru_cache(maxsize=2)
def _philly_profile(weekly: bool) -> tuple[np.ndarray, float]:
    return arrival_profile(load_trace("philly"), weekly=weekly)


def _fitted_arrivals(rng: np.random.Generator, n: int, profile: np.ndarray, rate_per_hour: float) -> np.ndarray:
    """Non-homogeneous Poisson arrivals with a periodic, hourly piecewise-constant rate.

    Time rescaling: unit-rate Poisson points on the cumulative-intensity axis, mapped back through the
    inverse of the cumulative intensity. Time 0 is the start of slot 0 (Monday 00:00).
    """
    hourly = profile * rate_per_hour  # expected jobs in each hour slot
    cum = np.cumsum(hourly)
    per_period = float(cum[-1])
    points = np.cumsum(rng.exponential(1.0, n))
    periods = np.floor(points / per_period)
    rest = points - periods * per_period
    slot = np.minimum(np.searchsorted(cum, rest, side="right"), profile.size - 1)
    before = np.where(slot > 0, cum[slot - 1], 0.0)
    within = np.clip((rest - before) / np.maximum(hourly[slot], 1e-300), 0.0, 1.0)
    return (periods * profile.size + slot + within) * _HOUR


def _check_positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise TraceError(f"{name} must be a positive number, got {value}")


def generate_jobs(
    n_jobs: int,
    *,
    seed: int = 0,
    arrival: str = "poisson",
    rate_per_hour: float | None = None,
    target_busy_gpus: float | None = None,
    fit: pl.DataFrame | TraceLoad | None = None,
    fit_origin: datetime | None = None,
    weekly: bool = True,
    duration_dist: str = "lognormal",
    duration_mu: float = LOGNORMAL_MU,
    duration_sigma: float = LOGNORMAL_SIGMA,
    pareto_shape: float = PARETO_SHAPE,
    pareto_scale_s: float = PARETO_SCALE_S,
    min_duration_s: float = MIN_DURATION_S,
    max_duration_s: float = MAX_DURATION_S,
    window_share: float = MAX_WINDOW_SHARE,
    gpu_mix: Mapping[int, float] | None = None,
    vc: str | None = None,
    kind: str = "train",
    job_id_prefix: str = "syn",
) -> pl.DataFrame:
    """Generate ``n_jobs`` synthetic training jobs as a canonical trace frame.

    Arrivals: "poisson" (constant rate) or "fitted" (hour-of-week profile of ``fit``, default the
    bundled Philly trace; ``weekly=False`` uses hour of day only). Rate: ``rate_per_hour``, or
    ``target_busy_gpus`` (via :func:`plan_load`: that many GPUs busy on average over the arrival window,
    durations resampled to at most ``window_share`` of it), else Philly's 31.47/h (or the fit trace's mean).
    Durations: clipped lognormal or Pareto II; sizes drawn from ``gpu_mix`` (default Philly's).
    """
    if isinstance(n_jobs, bool) or not isinstance(n_jobs, int | np.integer) or n_jobs < 0:
        raise TraceError(f"n_jobs must be a non-negative integer, got {n_jobs!r}")
    if arrival not in ARRIVALS:
        raise TraceError(f"unknown arrival '{arrival}'; use one of: {', '.join(ARRIVALS)}")
    if duration_dist not in DURATION_DISTS:
        raise TraceError(f"unknown duration_dist '{duration_dist}'; use one of: {', '.join(DURATION_DISTS)}")
    if kind not in KINDS:
        raise TraceError(f"unknown kind '{kind}'; use one of: {', '.join(KINDS)}")
    if rate_per_hour is not None and target_busy_gpus is not None:
        raise TraceError("give rate_per_hour or target_busy_gpus, not both")
    for name, value in (("min_duration_s", min_duration_s), ("max_duration_s", max_duration_s)):
        _check_positive(name, value)
    if min_duration_s > max_duration_s:
        raise TraceError(f"min_duration_s ({min_duration_s}) is above max_duration_s ({max_duration_s})")
    sizes, probs = _mix_arrays(gpu_mix)
    dist_args = dict(
        duration_mu=duration_mu,
        duration_sigma=duration_sigma,
        pareto_shape=pareto_shape,
        pareto_scale_s=pareto_scale_s,
        min_duration_s=min_duration_s,
        max_duration_s=max_duration_s,
    )
    if duration_dist == "lognormal":
        _check_positive("duration_sigma", duration_sigma)
        if not math.isfinite(duration_mu):
            raise TraceError(f"duration_mu must be a finite number, got {duration_mu}")
    else:
        _check_positive("pareto_shape", pareto_shape)
        _check_positive("pareto_scale_s", pareto_scale_s)
    bound = None
    if target_busy_gpus is not None and n_jobs > 0:
        mix = dict(zip(sizes.tolist(), probs.tolist(), strict=True))
        plan = plan_load(n_jobs, target_busy_gpus, mix, duration_dist, window_share=window_share, **dist_args)
        rate_per_hour, bound = plan.rate_per_hour, plan.max_duration_s

    rng = np.random.default_rng(seed)
    if arrival == "fitted":
        if fit is None and fit_origin is None:
            profile, fit_rate = _philly_profile(weekly)
        else:
            profile, fit_rate = arrival_profile(
                _philly_trace() if fit is None else fit, origin=fit_origin, weekly=weekly
            )
        rate = fit_rate if rate_per_hour is None else rate_per_hour
        _check_positive("rate_per_hour", rate)
        submit = _fitted_arrivals(rng, n_jobs, profile, rate)
    else:
        rate = PHILLY_RATE_PER_HOUR if rate_per_hour is None else rate_per_hour
        _check_positive("rate_per_hour", rate)
        submit = np.cumsum(rng.exponential(_HOUR / rate, n_jobs))
    num_gpus = rng.choice(sizes, size=n_jobs, p=probs)

    def draw(count: int) -> np.ndarray:
        if duration_dist == "lognormal":
            return rng.lognormal(duration_mu, duration_sigma, count)
        return pareto_scale_s * rng.pareto(pareto_shape, count)

    duration = draw(n_jobs)
    if bound is not None:  # resample the tail above the bound: the distribution conditioned on X <= bound
        over = np.flatnonzero(duration > bound)
        while over.size:
            duration[over] = draw(over.size)
            over = over[duration[over] > bound]
    duration = np.clip(duration, min_duration_s, max_duration_s)

    return jobs_from_arrays(
        submit.astype(np.float64), duration, num_gpus.astype(np.int32), prefix=job_id_prefix, vc=vc, kind=kind
    )


def _philly_trace() -> TraceLoad:
    return load_trace("philly")
