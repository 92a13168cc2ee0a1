"""Neural failure models on torch: an MLP on window aggregates, an LSTM and a 1D-CNN on the resampled window.

These are the paper's neural baselines (Liu et al., SYSTOR '23), and the two halves of its cascade ensemble
(a 1D-CNN filters out healthy instances, an MLP classifies the rest). All three share one recipe:

- inputs: ``sign(x) * log1p(|x|)`` (telemetry counters are heavy-tailed), then a robust per-feature scaler
  (median / IQR, std as fallback) fitted in ``fit``, clipped to +-8, NaN set to 0; tabular input gets a 0/1
  missing-indicator for every feature that had NaN in training, sequence input one extra channel holding the
  fraction of channels missing at each step (a telemetry gap);
- training: Adam, ``BCEWithLogitsLoss`` with ``pos_weight="balanced"`` (positives are a few percent),
  shuffled minibatches. At most ``max_train`` instances are kept, sampled per class. The latest
  ``val_fraction`` of them *by time* is held out for early stopping on validation average precision, and the
  best epoch's weights are kept. An epoch is ``epoch_size`` instances: the training positives (at most half
  the epoch) and fresh random negatives each epoch, so a large, imbalanced set costs a fixed time per epoch;
- ``score``: logits (float32; higher = more likely to fail), computed in chunks under ``inference_mode``.

Everything is deterministic given ``seed`` (and ``threads``); fitting and scoring leave torch's global RNG and
thread count as they found them. ``threads`` defaults to 1: these nets are small, and on a busy 2-core machine
two torch threads ran up to 10 times slower than one. A fitted model keeps its weights as NumPy arrays and
rebuilds the torch module on first use, so it copies between processes with ``pickle`` and saves to a model file
(:mod:`gpufleet.health.models.persist`: the weights in safetensors, the rest in JSON) with no extra code.

torch is imported at module level on purpose: the model registry imports this module inside a guard and
simply lists no torch models when torch is not installed.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Self

import numpy as np
import torch
from torch import nn

from gpufleet.errors import HealthError
from gpufleet.health.models.base import register_model
from gpufleet.health.models.persist import plain_state
from gpufleet.health.samples import Samples

_CLIP = 8.0  # scaled inputs are clipped to +-_CLIP: one wild counter must not dominate a batch
_SCALER_ROWS = 100_000  # rows (instances x steps for sequences) used to fit the scaler


class SamplesShapeError(HealthError, ValueError):
    """The instances do not have the shape the model expects (wrong rank, or other features than in ``fit``)."""


# --------------------------------------------------------------------------------------------------- inputs


@plain_state
@dataclass
class RobustScaler:
    """Per-column ``signed log1p``, then ``(x - center) / scale``, clipped; NaN -> 0 plus missing indicators.

    Columns are the last axis, so the same scaler serves tabular ``(n, f)`` and sequence ``(n, steps, c)``
    input. ``indicate`` marks the columns that get an extra 0/1 "was missing" column (channel) appended.
    """

    center: np.ndarray  # (d,) float32
    scale: np.ndarray  # (d,) float32, > 0
    indicate: np.ndarray  # (d,) bool: these columns get their own 0/1 missing-indicator column
    missing_fraction: bool = False  # append one column: the fraction of the d columns that are missing

    @staticmethod
    def fit(x: np.ndarray, rng: np.random.Generator, per_column: bool = True) -> RobustScaler:
        """Fit on ``x`` (``(..., d)``), using at most ``_SCALER_ROWS`` random rows of its flattened form.

        With ``per_column`` every column that had NaN gets an indicator column; without it, one column holds
        the fraction missing (cheaper for sequences, and a telemetry gap shows as all channels missing).
        """
        flat = x.reshape(-1, x.shape[-1])
        if len(flat) > _SCALER_ROWS:
            flat = flat[np.sort(rng.choice(len(flat), _SCALER_ROWS, replace=False))]
        t = _signed_log1p(_tensor(flat)).numpy()
        d = t.shape[1]
        center = np.zeros(d, np.float32)
        scale = np.ones(d, np.float32)
        finite = np.isfinite(t)
        for j in range(d):  # per column: columns differ in which rows are NaN
            col = t[finite[:, j], j].astype(np.float64)
            if len(col) == 0:
                continue
            q25, q50, q75 = np.percentile(col, [25, 50, 75])
            spread = (q75 - q25) / 1.349  # the IQR of a normal distribution is 1.349 sigma
            if spread < 1e-6:
                spread = float(np.std(col))
            center[j] = q50
            scale[j] = spread if spread > 1e-6 else 1.0
        had_nan = np.isnan(t).any(axis=0)
        if per_column:
            return RobustScaler(center=center, scale=scale, indicate=had_nan)
        return RobustScaler(
            center=center, scale=scale, indicate=np.zeros(d, bool), missing_fraction=bool(had_nan.any())
        )

    @property
    def n_out(self) -> int:
        """Columns after ``transform``: the inputs plus the indicator columns."""
        return len(self.center) + int(self.indicate.sum()) + int(self.missing_fraction)

    def transform(self, x: np.ndarray) -> torch.Tensor:
        """Scaled float32 tensor of ``x``: NaN -> 0 (inf is clipped), indicator columns appended on the last axis.

        Runs in torch (several times faster than NumPy's ``log1p`` on CPU); ``x`` itself is not modified.
        """
        raw = _tensor(x)
        missing = torch.isnan(raw)
        t = torch.addcmul(
            torch.from_numpy(-self.center / self.scale), _signed_log1p(raw), torch.from_numpy(1.0 / self.scale)
        )
        t = t.clamp_(-_CLIP, _CLIP).nan_to_num_(0.0)
        extra = []
        if self.indicate.any():
            extra.append(missing[..., torch.from_numpy(self.indicate)].float())
        if self.missing_fraction:
            extra.append(missing.sum(dim=-1, keepdim=True, dtype=torch.float32).div_(missing.shape[-1]))
        if extra:
            t = torch.cat([t, *extra], dim=-1)
        return t.contiguous()


def _tensor(x: np.ndarray) -> torch.Tensor:
    """A float32 tensor over ``x`` (shared memory when ``x`` is writable float32; never written to)."""
    x = np.asarray(x, dtype=np.float32)
    return torch.from_numpy(x if x.flags.writeable else x.copy())


def _signed_log1p(x: torch.Tensor) -> torch.Tensor:
    """``sign(x) * log1p(|x|)`` as a new tensor (NaN stays NaN)."""
    return x.abs().log1p_().copysign_(x)


# --------------------------------------------------------------------------------------------------- nets


class _MLPNet(nn.Module):
    def __init__(self, n_in: int, hidden: tuple[int, ...], dropout: float) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = n_in
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            width = h
        layers.append(nn.Linear(width, 1))
        self.body = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x).squeeze(-1)


class _LSTMNet(nn.Module):
    """Mean of every ``pool`` adjacent steps (the oldest ``steps % pool`` dropped), an LSTM, a head on its last state.

    Pooling halves the recurrence's cost at ``pool=2``: an LSTM is compute-bound on CPU, step by step.
    """

    def __init__(self, n_in: int, hidden: int, layers: int, pool: int, head: int) -> None:
        super().__init__()
        self.pool = pool
        self.lstm = nn.LSTM(n_in, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Sequential(nn.Linear(hidden, head), nn.ReLU(), nn.Linear(head, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (n, steps, c)
        n, steps, c = x.shape
        if self.pool > 1 and steps >= self.pool:
            x = x[:, steps % self.pool :].reshape(n, steps // self.pool, self.pool, c).mean(dim=2)
        _, (h, _) = self.lstm(x)
        return self.head(h[-1]).squeeze(-1)


class _CNNNet(nn.Module):
    """Convolutions over time, max-pooling by ``pool`` between them, then global max and mean pooling.

    The convolutions are ``Conv2d`` with ``(1, kernel)`` kernels over an ``(n, c, 1, steps)`` view: the same
    arithmetic as ``Conv1d``, about twice as fast on CPU in torch 2.x.
    """

    def __init__(self, n_in: int, channels: tuple[int, ...], kernel: int, pool: int, head: int) -> None:
        super().__init__()
        self.convs = nn.ModuleList()
        width = n_in
        for ch in channels:
            self.convs.append(nn.Conv2d(width, ch, (1, kernel), padding=(0, kernel // 2)))
            width = ch
        self.pool = pool
        self.head = nn.Sequential(nn.Linear(2 * width, head), nn.ReLU(), nn.Linear(head, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (n, steps, c)
        z = x.transpose(1, 2).unsqueeze(2)  # (n, c, 1, steps)
        for i, conv in enumerate(self.convs):
            z = torch.relu(conv(z))
            if i < len(self.convs) - 1 and self.pool > 1 and z.shape[-1] >= 2 * self.pool:
                z = nn.functional.max_pool2d(z, (1, self.pool))
        z = z.flatten(2)  # (n, ch, steps')
        return self.head(torch.cat([z.amax(dim=2), z.mean(dim=2)], dim=1)).squeeze(-1)


# --------------------------------------------------------------------------------------------------- models


class _TorchModel:
    """The shared fit / score recipe; subclasses say which array they read and which net they build.

    Options (keyword-only, shared by every torch model):
    ``epochs`` (10) at most, stopping ``patience`` (2) epochs after the best validation average precision;
    ``epoch_size`` (32,768) instances per epoch, ``None`` for a full pass; ``batch_size`` (512); Adam's ``lr``
    (2e-3) and ``weight_decay`` (1e-4); ``pos_weight`` ("balanced": negatives / positives in an epoch, or a
    number, or ``None`` for 1); ``max_train`` (200,000) instances kept, per class in proportion, ``None`` for
    all; ``val_fraction`` (0.1) latest by time held out; ``seed`` (0); ``threads`` (1) for
    ``torch.set_num_threads``, ``None`` to leave torch's setting; ``chunk_size`` (2,048) rows per forward pass
    when scoring (small chunks stay in cache: 2,048 was up to 2x faster than 65,536 on CPU).
    """

    name = "torch"
    #: :func:`~gpufleet.health.models.base.make_model` passes its ``torch_options`` to this model
    takes_torch_options = True

    def __init__(
        self,
        *,
        epochs: int = 10,
        epoch_size: int | None = 32_768,
        batch_size: int = 512,
        lr: float = 2e-3,
        weight_decay: float = 1e-4,
        pos_weight: float | str | None = "balanced",
        max_train: int | None = 200_000,
        val_fraction: float = 0.1,
        patience: int = 2,
        seed: int = 0,
        threads: int | None = 1,
        chunk_size: int = 2048,
    ) -> None:
        if epochs < 1 or batch_size < 1 or chunk_size < 1 or (epoch_size is not None and epoch_size < 2):
            raise ValueError("epochs, batch_size and chunk_size must be >= 1, epoch_size >= 2 or None")
        if not 0.0 <= val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
        if isinstance(pos_weight, str) and pos_weight != "balanced":
            raise ValueError(f"pos_weight must be 'balanced', a number or None, got {pos_weight!r}")
        self.epochs = epochs
        self.epoch_size = epoch_size
        self.batch_size = batch_size
        self.lr = lr
        self.weight_decay = weight_decay
        self.pos_weight = pos_weight
        self.max_train = max_train
        self.val_fraction = val_fraction
        self.patience = patience
        self.seed = seed
        self.threads = threads
        self.chunk_size = chunk_size
        # fitted state
        self.scaler_: RobustScaler | None = None
        self.input_shape_: tuple[int, ...] | None = None  # per-instance shape seen in fit
        self.state_: dict[str, np.ndarray] | None = None  # the net's state_dict as NumPy arrays
        self.constant_: float | None = None  # set instead of a net when training had a single class
        self.history_: list[float] = []  # validation average precision per epoch (empty: no validation)
        self.best_epoch_: int | None = None
        self._net: nn.Module | None = None

    # --- what subclasses provide ---------------------------------------------------------------------

    def _array(self, samples: Samples) -> np.ndarray:
        raise NotImplementedError

    def _build(self, n_in: int) -> nn.Module:
        raise NotImplementedError

    # --- public API ----------------------------------------------------------------------------------

    def fit(self, samples: Samples) -> Self:
        """Fit on labelled instances; returns ``self``."""
        if samples.y is None:
            raise HealthError(f"{self.name}.fit needs labelled samples (Samples.y is None)")
        x = self._array(samples)
        y = np.asarray(samples.y).astype(np.float32)
        if len(y) == 0:
            raise HealthError(f"{self.name}.fit got no instances")
        self.input_shape_ = tuple(x.shape[1:])
        rng = np.random.default_rng(self.seed)
        keep = _stratified_cap(y, self.max_train, rng)
        x, y, time = x[keep], y[keep], np.asarray(samples.time)[keep]
        self.scaler_ = RobustScaler.fit(x, rng, per_column=x.ndim == 2)
        self.history_, self.best_epoch_, self.state_, self._net = [], None, None, None
        n_pos = int(y.sum())
        if n_pos == 0 or n_pos == len(y):
            warnings.warn(
                f"{self.name}: training instances are all one class; the model scores a constant",
                RuntimeWarning,
                stacklevel=2,
            )
            self.constant_ = 10.0 if n_pos else -10.0
            return self
        self.constant_ = None
        train, val = _time_split(time, y, self.val_fraction)
        with _torch_context(self.seed, self.threads):
            net = self._build(self.scaler_.n_out)
            self._train(net, self.scaler_.transform(x[train]), y[train], x[val], y[val])
        return self

    def score(self, samples: Samples) -> np.ndarray:
        """Failure logits, float32 ``(n,)``; higher = more likely to fail."""
        if self.scaler_ is None:
            raise HealthError(f"{self.name} is not fitted: call fit before score")
        x = self._array(samples)
        if tuple(x.shape[1:]) != self.input_shape_:
            raise SamplesShapeError(
                f"{self.name} was fitted on instances of shape {self.input_shape_}, got {tuple(x.shape[1:])}; "
                "score with the same features (and steps/channels) as in fit"
            )
        if self.constant_ is not None:
            return np.full(len(x), self.constant_, np.float32)
        with _torch_context(None, self.threads):
            return self._logits(self._module(), x)

    # --- internals -----------------------------------------------------------------------------------

    def _train(self, net: nn.Module, xt: torch.Tensor, y: np.ndarray, x_val: np.ndarray, y_val: np.ndarray) -> None:
        """Train ``net`` on transformed inputs ``xt``; validate on raw ``x_val``; keep the best epoch's weights."""
        yt = torch.from_numpy(y)
        pos, neg = torch.from_numpy(np.flatnonzero(y > 0)), torch.from_numpy(np.flatnonzero(y <= 0))
        k_pos, k_neg = len(pos), len(neg)
        if self.epoch_size is not None and len(y) > self.epoch_size:  # positives (<= half), then fresh negatives
            k_pos = min(k_pos, self.epoch_size // 2)
            k_neg = self.epoch_size - k_pos
        if self.pos_weight == "balanced":
            pw = k_neg / max(k_pos, 1)
        else:
            pw = 1.0 if self.pos_weight is None else float(self.pos_weight)
        loss_fn = nn.BCEWithLogitsLoss(pos_weight=torch.tensor(pw, dtype=torch.float32))
        opt = torch.optim.Adam(net.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        gen = torch.Generator().manual_seed(self.seed)
        validate = len(y_val) > 0 and 0 < y_val.sum() < len(y_val)
        best, best_state, stale = -math.inf, None, 0
        for epoch in range(self.epochs):
            net.train()
            chosen = torch.cat(
                [
                    pos[torch.randperm(len(pos), generator=gen)[:k_pos]],
                    neg[torch.randperm(len(neg), generator=gen)[:k_neg]],
                ]
            )
            for idx in chosen[torch.randperm(len(chosen), generator=gen)].split(self.batch_size):
                opt.zero_grad(set_to_none=True)
                loss = loss_fn(net(xt[idx]), yt[idx])
                loss.backward()
                opt.step()
            if not validate:
                continue
            ap = _average_precision(y_val, self._logits(net, x_val))
            self.history_.append(ap)
            if ap > best:
                best, stale, self.best_epoch_ = ap, 0, epoch
                best_state = {k: v.detach().clone() for k, v in net.state_dict().items()}
            else:
                stale += 1
                if stale > self.patience:
                    break
        if best_state is not None:
            net.load_state_dict(best_state)
        else:
            self.best_epoch_ = self.epochs - 1
        net.eval()
        self.state_ = {k: v.detach().cpu().numpy().copy() for k, v in net.state_dict().items()}
        self._net = net

    def _logits(self, net: nn.Module, x: np.ndarray) -> np.ndarray:
        """Logits of raw (untransformed) input ``x``, ``chunk_size`` rows at a time."""
        assert self.scaler_ is not None
        was_training = net.training
        net.eval()
        out = np.empty(len(x), np.float32)
        with torch.inference_mode():
            for lo, hi in _chunks(len(x), self.chunk_size):
                out[lo:hi] = net(self.scaler_.transform(x[lo:hi])).numpy()
        net.train(was_training)
        return out

    def _module(self) -> nn.Module:
        if self._net is None:
            assert self.state_ is not None and self.scaler_ is not None
            net = self._build(self.scaler_.n_out)
            net.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in self.state_.items()})
            net.eval()
            self._net = net
        return self._net

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_net"] = None  # rebuilt from state_ on first use
        return state

    def __repr__(self) -> str:
        fitted = "fitted" if self.scaler_ is not None else "unfitted"
        return f"{type(self).__name__}({fitted}, seed={self.seed})"


class _SequenceModel(_TorchModel):
    """A torch model that reads ``Samples.sequence``, ``(n, steps, channels)``, oldest step first."""

    def _array(self, samples: Samples) -> np.ndarray:
        x = np.asarray(samples.sequence)
        if x.ndim != 3:
            raise SamplesShapeError(
                f"{self.name} reads Samples.sequence of shape (n, steps, channels); got shape {x.shape}"
            )
        return x


@register_model("mlp", help="MLP on window aggregates (Samples.tabular); torch")
class MLPModel(_TorchModel):
    """MLP on window aggregates (``Samples.tabular``): ``hidden`` ReLU layers, then a logit."""

    name = "mlp"

    def __init__(self, hidden: tuple[int, ...] = (64, 32), dropout: float = 0.0, **options: Any) -> None:
        super().__init__(**options)
        self.hidden = tuple(hidden)
        self.dropout = dropout

    def _array(self, samples: Samples) -> np.ndarray:
        x = np.asarray(samples.tabular)
        if x.ndim != 2:
            raise SamplesShapeError(f"mlp reads Samples.tabular of shape (n, features); got shape {x.shape}")
        return x

    def _build(self, n_in: int) -> nn.Module:
        return _MLPNet(n_in, self.hidden, self.dropout)


@register_model("lstm", help="LSTM over the resampled window (Samples.sequence); torch")
class LSTMModel(_SequenceModel):
    """LSTM over the resampled window (``Samples.sequence``); the last hidden state feeds a small head."""

    name = "lstm"

    def __init__(self, hidden: int = 32, layers: int = 1, pool: int = 2, head: int = 32, **options: Any) -> None:
        super().__init__(**options)
        self.hidden = hidden
        self.layers = layers
        self.pool = pool
        self.head = head

    def _build(self, n_in: int) -> nn.Module:
        return _LSTMNet(n_in, self.hidden, self.layers, self.pool, self.head)


@register_model("cnn1d", help="1D-CNN over the resampled window (Samples.sequence); torch")
class CNN1DModel(_SequenceModel):
    """1D-CNN over the resampled window (``Samples.sequence``): convolutions, global max+mean pool, a head."""

    name = "cnn1d"

    def __init__(
        self, channels: tuple[int, ...] = (32, 32), kernel: int = 3, pool: int = 2, head: int = 32, **options: Any
    ) -> None:
        super().__init__(**options)
        self.channels = tuple(channels)
        self.kernel = kernel
        self.pool = pool
        self.head = head

    def _build(self, n_in: int) -> nn.Module:
        return _CNNNet(n_in, self.channels, self.kernel, self.pool, self.head)


# --------------------------------------------------------------------------------------------------- helpers


def _stratified_cap(y: np.ndarray, cap: int | None, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices of at most ``cap`` instances, drawn per class in the classes' proportions."""
    n = len(y)
    if cap is None or n <= cap:
        return np.arange(n)
    keep = []
    pos = np.flatnonzero(y > 0)
    neg = np.flatnonzero(y <= 0)
    n_pos = min(len(pos), max(1 if len(pos) else 0, round(cap * len(pos) / n)))
    for idx, k in ((pos, n_pos), (neg, cap - n_pos)):
        keep.append(rng.choice(idx, min(k, len(idx)), replace=False))
    return np.sort(np.concatenate(keep))


def _time_split(time: np.ndarray, y: np.ndarray, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Train and validation indices: validation is the latest ``fraction`` of instances by time.

    The cut falls on a time boundary (an instant is never split) unless ties would push more than twice
    ``fraction`` into validation. With no usable validation (empty, or a single class), every instance trains.
    """
    n = len(time)
    order = np.argsort(time, kind="stable")
    n_val = math.ceil(fraction * n) if fraction > 0 else 0
    if n_val == 0 or n_val >= n:
        return order, order[:0]
    t_cut = time[order[n - n_val]]
    n_val_time = int((time >= t_cut).sum())
    if 0 < n_val_time <= min(2 * n_val, n - 1):
        n_val = n_val_time
    train, val = np.sort(order[: n - n_val]), np.sort(order[n - n_val :])
    if not 0 < y[val].sum() < len(val) or y[train].sum() == 0:
        return np.arange(n), order[:0]
    return train, val


def _average_precision(y: np.ndarray, score: np.ndarray) -> float:
    from sklearn.metrics import average_precision_score

    return float(average_precision_score(y, score))


def _chunks(n: int, size: int) -> Iterator[tuple[int, int]]:
    for lo in range(0, n, size):
        yield lo, min(lo + size, n)


@contextlib.contextmanager
def _torch_context(seed: int | None, threads: int | None) -> Iterator[None]:
    """Seed torch's global RNG (forked: the caller's RNG state is untouched) and set its thread count."""
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            yield
    finally:
        if threads is not None:
            torch.set_num_threads(old_threads)
