"""`search.prior`: the sweep's predictor (engine/predictor.py) as the search's starting point.

- `Prior.first(k)`: the k configurations of the space (coarsened: config.search_space
  .coarse_values) with the best predicted objective among those predicted to hold the SLA and
  to fit (the memory model, engine/feasibility.py): they run right after the baseline.
- `Prior.columns(...)`: every trial's prediction, for its row (engine/prediction.py), beside what
  it measured.
- `Prior.observe` / `Prior.corrected_next`: with `search.prior_refit_every: n`, after every n
  measured trials, each predicted metric is corrected by what this cluster measured so far
  (engine/correction.py), and the best untried configuration under the corrected prediction runs
  next.
A prediction never decides a verdict: only the measured rows do (results/verdict.py).
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path

from framework.base.vocabulary import Scalar
from framework.base.vocabulary import is_lower_bound
from framework.cluster.placement import shape_of
from framework.config.search_space import coarse_values
from framework.config.search_space import configurations
from framework.config.search_space import shape_setting
from framework.engine.correction import Correction
from framework.engine.correction import fit
from framework.engine.feasibility import parse_len
from framework.engine.prediction import PredictedLoad
from framework.engine.prediction import Prediction
from framework.engine.prediction import predict
from framework.engine.predictor import Deployment
from framework.engine.predictor import Predictor
from framework.engine.predictor import off_reason as predictor_off
from framework.engine.predictor import predictor
from framework.engine.server_args import trial_flags
from framework.search.tuner import Tuner
from framework.sweep.loader import Sweep
from framework.sweep.loader import feasibility
from framework.trial.objective import per_device

MAX_CANDIDATES = 400  # configurations predicted for the prior; a seeded sample beyond it
PREDICTED_DATASETS = ("random",)  # fixed input and output lengths: what a prediction takes


def off_reason(sweep: Sweep) -> str | None:
    """Why `search.prior` cannot serve this sweep, in one line (None: it can; also None
    without a prior)."""
    spec = sweep.spec
    if spec.search.prior is None:
        return None
    reason = predictor_off(spec.search.prior)
    if reason:
        return reason
    if spec.engine == "cpu" or spec.gpu is None:
        return ("it predicts GPUs from their kernel tables: set `gpu:` (the GPU type) on a "
                "`gpu` or `fake` engine sweep")
    if spec.workload.dataset not in PREDICTED_DATASETS or spec.workloads or spec.workload.mix:
        return (f"it predicts one workload of fixed lengths (dataset {PREDICTED_DATASETS[0]}), "
                f"not dataset {spec.workload.dataset}, several workloads or a mix")
    return None


class Prior:
    """One sweep's predictions, each configuration predicted once (cached)."""

    def __init__(self, sweep: Sweep, model: Predictor,
                 cache: dict[str, Prediction | None] | None = None) -> None:
        """`cache`: predictions to share with another Prior of the same sweep files and model."""
        self.sweep, self.model = sweep, model
        w = sweep.spec.workload
        self.load = PredictedLoad(input_len=w.input_len, output_len=w.output_len,
                                  num_prompts=w.num_prompts, max_concurrency=w.max_concurrency,
                                  request_rate=w.request_rate, percentiles=w.percentiles)
        self._cache: dict[str, Prediction | None] = {} if cache is None else cache
        self._seen: list[tuple[dict[str, Scalar], Prediction, Mapping[str, object]]] = []
        self._fit: dict[str, bool] = {}  # the memory model's verdict, by trial flags
        self._refits = 0
        self._queued = False

    @property
    def cache(self) -> dict[str, Prediction | None]:
        """Its predictions so far, by trial flags: for another Prior of the same sweep."""
        return self._cache

    def deployment(self, flags: Mapping[str, Scalar | None]) -> Deployment:
        """The predictor's view of a trial's flags (vLLM's defaults where unset)."""
        shape = shape_of(flags)

        def num(name: str) -> int | None:
            value = flags.get(name)
            return None if value is None else int(value)

        util = flags.get("gpu-memory-utilization")
        return Deployment(model=Path(self.sweep.spec.model), gpu=str(self.sweep.spec.gpu),
                          tensor_parallel=shape.tp, pipeline_parallel=shape.pp,
                          kv_cache_dtype=str(flags.get("kv-cache-dtype") or "auto"),
                          block_size=num("block-size"), max_num_seqs=num("max-num-seqs"),
                          max_num_batched_tokens=num("max-num-batched-tokens"),
                          enable_chunked_prefill=flags.get("enable-chunked-prefill") is not False,
                          max_model_len=(None if flags.get("max-model-len") is None
                                         else parse_len(flags["max-model-len"])),
                          **({} if util is None else {"gpu_memory_utilization": float(util)}))

    def _flags(self, params: Mapping[str, Scalar], is_baseline: bool = False
               ) -> dict[str, Scalar | None]:
        """The vLLM flags a trial of `params` runs with (the sweep's fixed args included)."""
        spec = self.sweep.spec
        return trial_flags(spec.server.args, self.sweep.space.server_params(params), is_baseline)

    def of(self, params: Mapping[str, Scalar], is_baseline: bool = False) -> Prediction | None:
        """The prediction of one configuration (None: the predictor cannot serve its deployment,
        or a prefill/decode shape, which it does not model)."""
        flags = self._flags(params, is_baseline)
        settings = self.sweep.space.shape_settings(params)
        key = repr((sorted(flags.items()), sorted(settings.items())))
        if key not in self._cache:
            self._cache[key] = self._predict(flags, settings)
        return self._cache[key]

    def _predict(self, flags: Mapping[str, Scalar | None], settings: Mapping[str, Scalar]
                 ) -> Prediction | None:
        if shape_setting(settings, "prefill-servers"):
            return None
        d = self.deployment(flags)
        if self.model.supports(d) is not None:
            return None
        engines = shape_of(flags).dp * shape_setting(settings, "replicas")
        return predict(self.model, d, self.load, engines=engines)

    def devices(self, params: Mapping[str, Scalar]) -> int:
        return shape_of(self._flags(params)).devices * \
            shape_setting(self.sweep.space.shape_settings(params), "replicas")

    def candidates(self) -> list[dict[str, Scalar]]:
        """The space's configurations at coarse values; a seeded sample of MAX_CANDIDATES
        when there are more."""
        space = self.sweep.space
        values = {n: coarse_values(p) for n, p in space.parameters.items()}
        every = list(itertools.islice(configurations(space, values), 20 * MAX_CANDIDATES))
        if len(every) <= MAX_CANDIDATES:
            return every
        return random.Random(self.sweep.spec.search.seed).sample(every, MAX_CANDIDATES)

    def value(self, params: Mapping[str, Scalar], prediction: Prediction,
              correction: Mapping[str, Correction] | None = None) -> float | None:
        """The predicted objective of `params` (None: predicted to break the SLA or not to fit;
        or the objective is not predicted), corrected when `correction` holds its metrics."""
        spec = self.sweep.spec
        if prediction.memory is not None and prediction.memory.kv_blocks <= 0:
            return None  # no room for the KV cache: it would not start
        metrics = dict(prediction.metrics)
        for name, c in (correction or {}).items():
            if name in metrics:
                metrics[name] = c.apply(params, metrics[name])
        metrics = per_device(metrics, self.devices(params))
        for key, limit in spec.sla.items():
            got = metrics.get(key)
            if got is not None and not is_lower_bound(key) and got > limit:
                return None
        if not self.fits(params):
            return None
        got = metrics.get(spec.objective.metric)
        return None if got is None or not math.isfinite(got) else float(got)

    def fits(self, params: Mapping[str, Scalar]) -> bool:
        """Whether our memory model (engine/feasibility.py) says `params` start; judged once
        per configuration, not at every refit's ranking of the space."""
        flags = self._flags(params)
        key = repr(sorted(flags.items()))
        if key not in self._fit:
            feas = feasibility(self.sweep, flags, None)
            self._fit[key] = feas is None or feas.ok
        return self._fit[key]

    def ranked(self, candidates: Sequence[Mapping[str, Scalar]],
               correction: Mapping[str, Correction] | None = None) -> list[dict[str, Scalar]]:
        """`candidates` predicted feasible, best predicted objective first."""
        scored = []
        for params in candidates:
            prediction = self.of(params)
            value = None if prediction is None else self.value(params, prediction, correction)
            if value is not None:
                scored.append((value, dict(params)))
        sign = -1.0 if self.sweep.spec.objective.direction == "maximize" else 1.0
        return [p for _, p in sorted(scored, key=lambda s: sign * s[0])]

    def first(self, k: int) -> list[dict[str, Scalar]]:
        """The prior's top k: run first, after the baseline."""
        return self.ranked(self.candidates())[:k]

    def queue_first(self, tuner: Tuner, say: Callable[[str], object]) -> None:
        """Queue the top `search.prior_top_k` in the study (those it has not run or queued),
        saying what it does: predicting a space takes ~0.1 s a configuration."""
        if self._queued:
            return
        self._queued = True
        k = self.sweep.spec.search.prior_top_k
        say(f"search.prior {self.model.name}: predicting the space's configurations at the "
            f"sweep's load (up to {MAX_CANDIDATES}) for the first {k} trials after the baseline")
        first = self.first(k)
        queued = tuner.enqueue_new(first)
        for params in first:
            prediction = self.of(params)
            value = None if prediction is None else self.value(params, prediction)
            shown = "?" if value is None else f"{value:.4g}"
            say(f"  predicted {self.sweep.spec.objective.metric} {shown}: "
                + " ".join(f"{n}={v}" for n, v in params.items()))
        if not first:
            say("  no configuration is predicted to hold the SLA and fit: the search starts "
                "without the prior")
        elif not queued:
            say("  (already run or queued in this study)")

    def columns(self, params: Mapping[str, Scalar], is_baseline: bool) -> dict[str, object] | None:
        prediction = self.of(params, is_baseline)
        return None if prediction is None else prediction.columns()

    def observe(self, params: Mapping[str, Scalar], row: Mapping[str, object]) -> None:
        """A recorded trial: kept for the correction when it was measured."""
        prediction = self.of(params, bool(row.get("is_baseline")))
        if row.get("state") == "COMPLETE" and prediction is not None:
            self._seen.append((dict(params), prediction, row))

    def corrections(self) -> dict[str, Correction]:
        """Each predicted metric's correction on the measured trials seen so far."""
        out = {}
        for metric in self._seen[0][1].metrics if self._seen else ():
            pairs = [(p, float(pred.metrics[metric]), float(row[metric]))  # type: ignore[arg-type]
                     for p, pred, row in self._seen if isinstance(row.get(metric), (int, float))]
            c = fit(metric, pairs)
            if c is not None:
                out[metric] = c
        return out

    def corrected_next(self, tried: Sequence[Mapping[str, Scalar]]) -> dict[str, Scalar] | None:
        """Every `prior_refit_every` measured trials: the best configuration not in `tried`
        under the corrected prediction (None between refits, or when none is left)."""
        every = self.sweep.spec.search.prior_refit_every
        if not every or len(self._seen) < every * (self._refits + 1):
            return None
        self._refits += 1
        seen = [dict(t) for t in tried]
        return next((p for p in self.ranked(self.candidates(), self.corrections())
                     if p not in seen), None)


def sweep_prior(sweep: Sweep) -> Prior | None:
    """The sweep's prior (None without `search.prior`, or when it cannot serve: `validate`
    says why, off_reason)."""
    if sweep.spec.search.prior is None or off_reason(sweep) is not None:
        return None
    return Prior(sweep, predictor(sweep.spec.search.prior))
