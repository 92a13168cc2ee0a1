"""Network contention between co-located multi-node jobs: a calibrated sensitivity x intensity model.

When job A shares a network link with other jobs, its communication phases find the link busy for part
of the time. Sharing a link max-min fairly with the jobs that are communicating on it at the same moment,
A's communication stretches by the expected number of such jobs, so

    ratio_A = 1 / (1 + s_A * sum_B p_B)

where ``s_A`` (sensitivity) is the share of A's iteration spent in exposed communication, and ``p_B``
(intensity) is the share of time B keeps the link busy. Both are products of a per-model constant and a
per-placement constant (GPUs, nodes), so the whole model has a few free constants: 2 x 6 models and
2 x 6 placements for DeepShare's table. They are fitted to DeepShare's measured co-location matrix
(shipped as ``gpufleet/data/contention``, 18 job types on 4 x 8 TITAN Xp over 40 Gb/s InfiniBand).

On another NIC the communication share scales with the bandwidth ratio to the 40 Gb/s testbed (first
order: the bytes stay, the time shrinks). Placements the table does not measure take the constants of the
nearest measured placement (by GPUs per node, then nodes). Single-node placements have no network traffic
and see no contention; their speed comes from the intra-node model in :meth:`ContentionModel.relative_speed`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from gpufleet.data import bundled_path
from gpufleet.errors import ConfigError

__all__ = [
    "DEEPSHARE_MODELS",
    "TESTBED_GBPS",
    "ContentionModel",
    "FitReport",
    "Placement",
    "default_deepshare_folder",
    "fit_contention",
    "load_deepshare",
    "predicted_ratios",
    "victim_type_mask",
]

#: DeepShare's six workloads in its job-type order (serial = model index x 3 + GPU-demand index + 1).
DEEPSHARE_MODELS = ("MobileNetV3", "GraphSage", "FSDP", "Transformer-XL", "DLRM", "MoE")
#: The calibration testbed's network: Mellanox ConnectX-4 at 40 Gb/s InfiniBand (DeepShare poster).
TESTBED_GBPS = 40.0
#: Its intra-node path: PCIe Gen3 x16, 16 GB/s = 128 Gb/s (no NVLink on TITAN Xp).
TESTBED_INTRA_GBPS = 128.0
#: Share of the isolated iteration the most network-bound DeepShare job type spends communicating: the fit
#: identifies only s x p, and this sets the split (an assumption, not a measurement).
MAX_COMM_SHARE = 0.8
#: A (gpus, nodes) placement.
Placement = tuple[int, int]

#: Where DeepShare's tables come from, for the error when a folder lacks them (the wheel ships a copy).
DEEPSHARE_SOURCE = (
    "copy scheduler/jobs/isolated_thp.csv, shared_thp_ratio.csv and total_samples_trained.csv from "
    "https://github.com/gajagajago/deepshare (Apache-2.0), renamed with a 'deepshare_' prefix, "
    "or give no folder for the shipped copy"
)
_DATA_FILES = {
    "isolated": "deepshare_isolated_thp.csv",
    "ratios": "deepshare_shared_thp_ratio.csv",
    "samples": "deepshare_total_samples_trained.csv",
}


@dataclass(frozen=True)
class DeepShareData:
    """DeepShare's measurements: job-type keys (model, gpus, nodes), isolated throughput and the ratio matrix."""

    keys: list[tuple[str, int, int]]
    isolated: dict[tuple[str, int, int], float]
    ratios: np.ndarray  # ratios[a, b]: a's throughput beside b over a's throughput alone
    samples: dict[tuple[str, int], float]  # samples each (model, gpus) job trains


def _split_key(text: str, path: Path) -> tuple[str, int, int]:
    parts = [p.strip() for p in text.strip().strip('"').split(",")]
    if len(parts) != 3:
        raise ConfigError(f"{path}: job-type key '{text}' is not 'model,gpus,nodes'")
    try:
        return parts[0], int(parts[1]), int(parts[2])
    except ValueError as exc:
        raise ConfigError(f"{path}: job-type key '{text}' has a non-integer GPU or node count") from exc


def default_deepshare_folder() -> Path:
    """The folder of DeepShare's three tables shipped in the wheel (``gpufleet/data/contention``)."""
    return bundled_path("contention")


def load_deepshare(folder: str | Path | None = None) -> DeepShareData:
    """Read DeepShare's three CSV tables from ``folder`` (``None``: the tables shipped in the wheel)."""
    import polars as pl

    folder = Path(folder) if folder is not None else default_deepshare_folder()
    paths = {k: folder / v for k, v in _DATA_FILES.items()}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        raise ConfigError(
            f"contention data missing: {', '.join(missing)} (expected DeepShare's tables "
            f"{', '.join(_DATA_FILES.values())} in {folder}); {DEEPSHARE_SOURCE}"
        )
    iso = pl.read_csv(paths["isolated"])
    isolated = {_split_key(k, paths["isolated"]): float(v) for k, v in iso.iter_rows()}
    mat = pl.read_csv(paths["ratios"])
    keys = [_split_key(c, paths["ratios"]) for c in mat.columns[1:]]
    rows = [_split_key(str(r), paths["ratios"]) for r in mat[mat.columns[0]].to_list()]
    if rows != keys:
        raise ConfigError(f"{paths['ratios']}: row keys differ from column keys")
    ratios = mat.select(mat.columns[1:]).to_numpy().astype(np.float64)
    if ratios.shape != (len(keys), len(keys)) or not np.isfinite(ratios).all():
        raise ConfigError(f"{paths['ratios']}: expected a full {len(keys)} x {len(keys)} numeric matrix")
    raw = paths["samples"].read_text(encoding="utf-8-sig")
    lines = [ln.split(",") for ln in raw.strip().splitlines()]
    demands = [int(x) for x in lines[0][1:]]
    samples = {(ln[0], g): float(v) for ln in lines[1:] for g, v in zip(demands, ln[1:], strict=True)}
    return DeepShareData(keys, isolated, ratios, samples)


@dataclass
class ContentionModel:
    """Per-model and per-placement sensitivity / intensity constants, and each job type's isolated speed."""

    model_s: dict[str, float]
    model_p: dict[str, float]
    place_s: dict[Placement, float]
    place_p: dict[Placement, float]
    #: measured isolated throughput (samples/s) by (model, gpus, nodes)
    isolated: dict[tuple[str, int, int], float] = field(default_factory=dict)
    #: samples a (model, gpus) job trains in DeepShare's traces
    samples: dict[tuple[str, int], float] = field(default_factory=dict)
    reference_gbps: float = TESTBED_GBPS
    intra_gbps: float = TESTBED_INTRA_GBPS
    source: str = ""

    # ------------------------------------------------------------------ lookups
    @property
    def models(self) -> list[str]:
        """The communication profiles the model knows (DeepShare's workloads)."""
        return list(self.model_s)

    def _nearest(self, table: dict[Placement, float], gpus: int, nodes: int) -> float:
        if (gpus, nodes) in table:
            return table[(gpus, nodes)]
        per_node = gpus / nodes
        best = min(
            table,
            key=lambda k: (abs(math.log(k[0] / k[1]) - math.log(per_node)), abs(math.log(k[1]) - math.log(nodes))),
        )
        return table[best]

    def _check(self, model: str) -> None:
        if model not in self.model_s:
            raise ConfigError(f"unknown communication profile '{model}'; known: {', '.join(self.model_s)}")

    def _factor(
        self,
        per_model: dict[str, float],
        per_place: dict[Placement, float],
        model: str,
        gpus: int,
        nodes: int,
        nic_gbps: float | None,
    ) -> float:
        """Model constant x placement constant, scaled to the NIC (0 on one node: no network traffic)."""
        if nodes <= 1:
            return 0.0
        self._check(model)
        scale = 1.0 if nic_gbps is None else self.reference_gbps / float(nic_gbps)
        return per_model[model] * self._nearest(per_place, gpus, nodes) * scale

    def sensitivity(self, model: str, gpus: int, nodes: int, nic_gbps: float | None = None) -> float:
        """How much a unit of competing link load slows this job (0 on one node)."""
        return self._factor(self.model_s, self.place_s, model, gpus, nodes, nic_gbps)

    def intensity(self, model: str, gpus: int, nodes: int, nic_gbps: float | None = None) -> float:
        """The link load this job puts on each NIC it uses (0 on one node)."""
        return self._factor(self.model_p, self.place_p, model, gpus, nodes, nic_gbps)

    def ratio(self, sensitivity: float, load: float) -> float:
        """Throughput ratio of a job of ``sensitivity`` on links carrying ``load`` of other jobs' traffic."""
        return 1.0 / (1.0 + sensitivity * load)

    def pair_ratio(self, victim: tuple[str, int, int], aggressor: tuple[str, int, int]) -> float:
        """Predicted throughput ratio of ``victim`` (model, gpus, nodes) sharing a node with ``aggressor``."""
        return self.ratio(self.sensitivity(*victim), self.intensity(*aggressor))

    def comm_share(self, model: str, gpus: int, nodes: int) -> float:
        """Share of the isolated iteration spent communicating over the network (the sensitivity, capped)."""
        return min(self.sensitivity(model, gpus, max(nodes, 2)), MAX_COMM_SHARE)

    def isolated_throughput(self, model: str, gpus: int, nodes: int) -> float:
        """Samples/s of ``model`` on ``gpus`` GPUs over ``nodes`` nodes with nothing beside it.

        Measured where DeepShare measured it. One node (never measured): the 2-node figure with the network
        share of the iteration moved onto the intra-node path (PCIe Gen3, 16 GB/s vs 40 Gb/s InfiniBand):
        ``t1 = t2 * (1 - u + u * net / intra)`` with ``u`` the communication share, and never below the
        best measured spread of the same GPU count (TITAN Xp nodes share PCIe, so a few light models run
        faster spread; one node is taken to be at least as fast). Other node counts: the
        measured point of the same GPU count with the nearest node count.
        """
        self._check(model)
        if (model, gpus, nodes) in self.isolated:
            return self.isolated[(model, gpus, nodes)]
        measured = {n: v for (m, g, n), v in self.isolated.items() if m == model and g == gpus}
        if not measured:
            # scale the nearest measured GPU count linearly in GPUs (data parallel)
            counts = sorted({g for (m, g, _n) in self.isolated if m == model})
            if not counts:
                raise ConfigError(f"no isolated throughput for '{model}'")
            near = min(counts, key=lambda g: abs(math.log(g / gpus)))
            # keep the GPUs per node: 16 GPUs on 4 nodes behaves like 8 GPUs on 2
            scaled_nodes = max(1, round(nodes * near / gpus))
            return self.isolated_throughput(model, near, scaled_nodes) * gpus / near
        if nodes <= 1:
            two = measured.get(2, measured[min(measured)])
            u = self.comm_share(model, gpus, 2)
            # never slower than the best measured spread: one node's GPUs share no network at all
            return max(two / (1.0 - u + u * self.reference_gbps / self.intra_gbps), max(measured.values()))
        near = min(measured, key=lambda n: abs(math.log(n / nodes)))
        return measured[near]

    def relative_speed(self, model: str, gpus: int, nodes: int, gpus_per_node: int) -> float:
        """Isolated throughput on ``nodes`` nodes over that on the fewest nodes the job can use."""
        fewest = max(1, -(-gpus // gpus_per_node))
        if nodes <= fewest:
            return 1.0
        speed = self.isolated_throughput(model, gpus, nodes) / self.isolated_throughput(model, gpus, fewest)
        return min(speed, 1.0)  # a job's duration is its time on the fewest nodes: spreading never beats it

    def duration_s(self, model: str, gpus: int, gpus_per_node: int = 8) -> float:
        """Seconds a DeepShare job of ``model`` on ``gpus`` GPUs takes alone on the fewest nodes."""
        self._check(model)
        if (model, gpus) not in self.samples:
            raise ConfigError(f"no DeepShare job size for '{model}' on {gpus} GPUs")
        fewest = max(1, -(-gpus // gpus_per_node))
        return self.samples[(model, gpus)] / self.isolated_throughput(model, gpus, fewest)

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form (placements and type keys as 'gpus,nodes' / 'model,gpus,nodes' strings)."""
        return {
            "source": self.source,
            "reference_gbps": self.reference_gbps,
            "intra_gbps": self.intra_gbps,
            "model_sensitivity": self.model_s,
            "model_intensity": self.model_p,
            "placement_sensitivity": {f"{g},{n}": v for (g, n), v in self.place_s.items()},
            "placement_intensity": {f"{g},{n}": v for (g, n), v in self.place_p.items()},
            "isolated_throughput": {f"{m},{g},{n}": v for (m, g, n), v in self.isolated.items()},
            "samples_to_train": {f"{m},{g}": v for (m, g), v in self.samples.items()},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ContentionModel:
        """Inverse of :meth:`to_dict`."""

        def place(d: dict[str, float]) -> dict[Placement, float]:
            out = {}
            for k, v in d.items():
                g, n = k.split(",")
                out[(int(g), int(n))] = float(v)
            return out

        try:
            iso = {}
            for k, v in data.get("isolated_throughput", {}).items():
                m, g, n = k.rsplit(",", 2)
                iso[(m, int(g), int(n))] = float(v)
            samples = {}
            for k, v in data.get("samples_to_train", {}).items():
                m, g = k.rsplit(",", 1)
                samples[(m, int(g))] = float(v)
            return cls(
                model_s={k: float(v) for k, v in data["model_sensitivity"].items()},
                model_p={k: float(v) for k, v in data["model_intensity"].items()},
                place_s=place(data["placement_sensitivity"]),
                place_p=place(data["placement_intensity"]),
                isolated=iso,
                samples=samples,
                reference_gbps=float(data.get("reference_gbps", TESTBED_GBPS)),
                intra_gbps=float(data.get("intra_gbps", TESTBED_INTRA_GBPS)),
                source=str(data.get("source", "")),
            )
        except (KeyError, ValueError, AttributeError) as exc:
            raise ConfigError(f"not a contention model: {exc}") from exc

    def save(self, path: str | Path) -> None:
        """Write the model as JSON."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> ContentionModel:
        """Read a model written by :meth:`save`."""
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read contention model {path}: {exc}") from exc

    @classmethod
    def default(cls) -> ContentionModel:
        """The model fitted to DeepShare's matrix that ships with gpufleet (``gpufleet contention fit``)."""
        return _default_model()


_DEFAULT: ContentionModel | None = None


def _default_model() -> ContentionModel:
    global _DEFAULT
    if _DEFAULT is None:
        text = resources.files("gpufleet.data").joinpath("contention_model.json").read_text()
        _DEFAULT = ContentionModel.from_dict(json.loads(text))
    return _DEFAULT


# ---------------------------------------------------------------------- fitting
@dataclass
class FitReport:
    """A fitted model and its errors on the cells it was fitted to and on the held-back cells."""

    model: ContentionModel
    keys: list[tuple[str, int, int]]
    measured: np.ndarray
    predicted: np.ndarray
    train_mask: np.ndarray
    seed: int
    holdout: float

    def _err(self, mask: np.ndarray) -> np.ndarray:
        return np.abs(self.predicted - self.measured)[mask]

    @property
    def test_mae(self) -> float:
        """Mean absolute error of the throughput ratio on held-back cells."""
        return float(self._err(~self.train_mask).mean())

    @property
    def test_max(self) -> float:
        """Worst absolute error on held-back cells."""
        return float(self._err(~self.train_mask).max())

    @property
    def train_mae(self) -> float:
        """Mean absolute error on the cells the fit saw."""
        return float(self._err(self.train_mask).mean())

    def per_type(self) -> list[dict[str, Any]]:
        """Held-back error of each job type as the victim (its row of the matrix)."""
        out = []
        err = np.abs(self.predicted - self.measured)
        for i, (m, g, n) in enumerate(self.keys):
            test = ~self.train_mask[i]
            out.append(
                {
                    "job_type": f"{m},{g},{n}",
                    "held_back": int(test.sum()),
                    "mae": float(err[i][test].mean()) if test.any() else math.nan,
                    "max": float(err[i][test].max()) if test.any() else math.nan,
                    "sensitivity": self.model.sensitivity(m, g, n),
                    "intensity": self.model.intensity(m, g, n),
                }
            )
        return out

    def summary(self) -> dict[str, Any]:
        """The headline figures as a dict."""
        n_params = len(self.model.model_s) + len(self.model.model_p) + len(self.model.place_s) + len(self.model.place_p)
        return {
            "cells": int(self.measured.size),
            "held_back": int((~self.train_mask).sum()),
            "holdout": self.holdout,
            "seed": self.seed,
            "free_constants": n_params,
            "train_mae": self.train_mae,
            "test_mae": self.test_mae,
            "test_max": self.test_max,
        }


def fit_contention(
    data: DeepShareData, holdout: float = 0.3, seed: int = 0, train_mask: np.ndarray | None = None
) -> FitReport:
    """Fit the per-model and per-placement constants to the cells of ``train_mask`` (default: a random
    ``1 - holdout`` of the matrix drawn with ``seed``) by robust least squares on the ratio."""
    from scipy.optimize import least_squares

    if not 0.0 <= holdout < 1.0:
        raise ConfigError(f"holdout must be in [0, 1), got {holdout}")
    keys = data.keys
    n = len(keys)
    models = list(dict.fromkeys(k[0] for k in keys))
    places = list(dict.fromkeys((k[1], k[2]) for k in keys))
    mi = np.array([models.index(k[0]) for k in keys])
    pi = np.array([places.index((k[1], k[2])) for k in keys])
    if train_mask is None:
        train_mask = np.random.default_rng(seed).random((n, n)) >= holdout
    measured = data.ratios
    nm, npl = len(models), len(places)

    def unpack(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        sm, pm = x[:nm], x[nm : 2 * nm]
        sp, pp = x[2 * nm : 2 * nm + npl], x[2 * nm + npl :]
        return sm[mi] * sp[pi], pm[mi] * pp[pi]

    def predict(x: np.ndarray) -> np.ndarray:
        s, p = unpack(x)
        return 1.0 / (1.0 + np.outer(s, p))

    x0 = np.full(2 * (nm + npl), 0.5)
    sol = least_squares(
        lambda x: (predict(x) - measured)[train_mask], x0, bounds=(0.0, 20.0), loss="soft_l1", f_scale=0.05
    )
    x = sol.x
    sm, pm = x[:nm], x[nm : 2 * nm]
    sp, pp = x[2 * nm : 2 * nm + npl], x[2 * nm + npl :]
    # s * p is identified only up to a common factor: the most sensitive job type is taken to spend
    # MAX_COMM_SHARE of its isolated iteration communicating (a comm-heavy job on 40 Gb/s)
    s_all, _ = unpack(x)
    scale = MAX_COMM_SHARE / (float(s_all.max()) or 1.0)
    model = ContentionModel(
        model_s={m: float(v) * scale for m, v in zip(models, sm, strict=True)},
        model_p={m: float(v) / scale for m, v in zip(models, pm, strict=True)},
        place_s={pl_: float(v) for pl_, v in zip(places, sp, strict=True)},
        place_p={pl_: float(v) for pl_, v in zip(places, pp, strict=True)},
        isolated=dict(data.isolated),
        samples=dict(data.samples),
        source=f"fitted to DeepShare's co-location matrix ({int(train_mask.sum())} of {n * n} cells, seed {seed})",
    )
    return FitReport(model, keys, measured, predict(x), train_mask, seed, holdout)


def predicted_ratios(model: ContentionModel, keys: Sequence[tuple[str, int, int]]) -> np.ndarray:
    """The model's full co-location matrix over ``keys``."""
    s = np.array([model.sensitivity(*k) for k in keys])
    p = np.array([model.intensity(*k) for k in keys])
    return 1.0 / (1.0 + np.outer(s, p))


def victim_type_mask(n_types: int, holdout: float, seed: int = 0) -> np.ndarray:
    """A ``train_mask`` for :func:`fit_contention` that holds back whole victim job types, not random cells.

    A seeded random ``holdout`` share of the ``n_types`` job types (at least one, at most all but one) loses
    its whole row of the matrix (the type as the victim): the fit never sees how those types suffer, so the
    held-back error says how well the per-model x per-placement factoring predicts an unmeasured job type.
    """
    if not 0.0 < holdout < 1.0:
        raise ConfigError(f"holdout must be in (0, 1) to hold back job types, got {holdout}")
    if n_types < 2:
        raise ConfigError(f"holding back job types needs at least 2 types, got {n_types}")
    k = min(max(1, round(holdout * n_types)), n_types - 1)
    held = np.random.default_rng(seed).choice(n_types, size=k, replace=False)
    mask = np.ones((n_types, n_types), dtype=bool)
    mask[held, :] = False
    return mask
