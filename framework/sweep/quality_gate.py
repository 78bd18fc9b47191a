"""The quality probe in a sweep: which trials run it, the baseline's reference answers, and each
probed trial's verdict (framework.trial.quality for the numbers and the rule).

- The baseline trial probes twice on its server after its measured load: at the probe's
  concurrency (run 0, the reference) and at concurrency 1 (run 1); run 1 against run 0 is the
  baseline's self-agreement, the noise floor of batching. Both runs are stored
  (`probes/trial-NNNNN.parquet`), so a resumed sweep compares with the same reference.
- A trial that changes an output flag against the baseline (framework.engine.output_flags:
  kv-cache-dtype, quantization, dtype, speculative decoding, or a `lossy: true` parameter), or
  runs prefill/decode (its answers come from transferred KV), probes once, at the probe's
  concurrency, and is judged against the reference. A baseline trial run again (confirmation,
  retry) once a reference exists is judged the same way.
- Every other trial is not probed: it changes no flag that changes outputs, and its quality
  columns stay null; under `sla.min_token_agreement` it counts as agreement 1.0.
- The fake engine serves no model: nothing is probed there.
- A probed trial finishing while the baseline still runs (trials side by side) waits for the
  reference, at most REFERENCE_WAIT_S; with no reference (no baseline in the sweep, the
  baseline failed, or the wait ran out) its quality is unknown, with a note, and fails
  `min_token_agreement`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from collections.abc import Sequence

from framework.base.errors import TrialError
from framework.base.vocabulary import MIN_TOKEN_AGREEMENT
from framework.engine.output_flags import output_changes
from framework.engine.server_args import trial_flags
from framework.load.probe import ProbeAnswer
from framework.load.probe import ProbeError
from framework.load.probe import ProbeSettings
from framework.load.probe import probe_prompts
from framework.load.probe import send_probe
from framework.load.workload import load_tokenizer
from framework.results.probe_rows import PROBE_COLUMNS
from framework.results.probe_rows import probe_rows
from framework.results.probe_rows import stored_reference
from framework.search.tuner import Proposal
from framework.sweep.loader import Sweep
from framework.sweep.trial_plan import TrialPlan
from framework.trial.quality import Agreement
from framework.trial.quality import QualityVerdict
from framework.trial.quality import compare
from framework.trial.quality import judge
from framework.trial.quality import sla_terms
from framework.trial.quality import unknown
from framework.trial.run import TrialOutcome

PROBE_SEED = 4000  # the probe's prompts are drawn with workload seed + this
REFERENCE_WAIT_S = 1800.0  # how long a probed trial waits for a running baseline's reference


class QualityGate:
    """One sweep's quality probe; its methods are called from the runner's threads (module
    docstring): `probe_for` and the hooks from trial threads, `recorded` from the main one."""

    def __init__(self, sweep: Sweep, settings: ProbeSettings | None = None) -> None:
        spec = sweep.spec
        self.sweep, self.store = sweep, sweep.store
        self.settings = settings or ProbeSettings(seed=spec.workload.seed + PROBE_SEED)
        self.min_agreement = spec.sla.get(MIN_TOKEN_AGREEMENT)
        self.baseline_flags = trial_flags(spec.server.args, {}, True)
        self.declared = {n: p.default for n, p in sweep.space.parameters.items() if p.lossy}
        self._api_key = sweep.api_key
        self._prompts: list[str] | None = None
        self._prompts_lock = threading.Lock()
        self._cond = threading.Condition()
        self._baselines_running = 0
        self._reference: tuple[tuple[ProbeAnswer, ...], Agreement] | None = None
        stored = stored_reference(self.store.read_probes())
        if stored is not None:
            _, first, second = stored
            self._reference = (first, compare(first, second))

    def changes(self, plan: TrialPlan) -> tuple[str, ...]:
        """The output-changing flags trial `plan` sets to other values than the baseline, and
        a prefill/decode shape (its decode servers answer from KV another server computed: a
        connector that corrupts it changes the outputs)."""
        changes = output_changes(plan.flags, self.baseline_flags, self.declared)
        return (*changes, "prefill/decode (KV transferred)") if plan.prefill else changes

    def probe_for(self, plan: TrialPlan) -> Callable[[str], QualityVerdict] | None:
        """Trial `plan`'s probe hook for run_trial (called with the server's base URL), or None
        when the trial is not probed."""
        p = plan.proposal
        if self.sweep.spec.engine == "fake":
            return None
        with self._cond:
            if p.is_baseline and self._reference is None:
                self._baselines_running += 1
                return lambda url: self._probe_baseline(p.number, url)
        changes = self.changes(plan)
        if not p.is_baseline and not changes:
            return None
        note = (f"changes {', '.join(changes)}" if changes
                else "the baseline again, against its first reference")
        return lambda url: self._probe_trial(p.number, p.is_baseline, url, note)

    def recorded(self, p: Proposal, outcome: TrialOutcome
                 ) -> tuple[dict[str, float], dict[str, float]]:
        """From the main thread as trial `p` is recorded: the SLA limits and judged values to
        evaluate it by (trial.quality.sla_terms). A recorded baseline no longer runs, so
        trials waiting for its reference stop waiting."""
        if p.is_baseline:
            with self._cond:
                self._baselines_running = max(0, self._baselines_running - 1)
                self._cond.notify_all()
        return sla_terms(self.sweep.spec.sla, outcome.quality)

    def _probe_baseline(self, number: int, url: str) -> QualityVerdict:
        concurrency = self.settings.concurrency
        first, second = self._send(url, concurrency), self._send(url, 1)
        self.store.write_probe(number, probe_rows(number, True, [(concurrency, first),
                                                                 (1, second)]), PROBE_COLUMNS)
        itself = compare(first, second)
        with self._cond:
            if self._reference is None:
                self._reference = (first, itself)
            self._cond.notify_all()
        return judge(itself, itself, self.min_agreement,
                     note=f"the baseline: its run at concurrency 1 against its run at "
                          f"concurrency {concurrency} (the reference)")

    def _probe_trial(self, number: int, is_baseline: bool, url: str, note: str
                     ) -> QualityVerdict:
        answers = self._send(url, self.settings.concurrency)
        self.store.write_probe(number, probe_rows(number, is_baseline,
                                                  [(self.settings.concurrency, answers)]),
                               PROBE_COLUMNS)
        reference = self._wait_reference()
        if reference is None:
            why = ("the sweep has no baseline trial (search.baseline: false)"
                   if not self.sweep.spec.search.baseline else
                   "the baseline trial stored no probe (it failed or ran before the probe "
                   "existed)")
            return unknown(f"{note}; quality unknown: {why}")
        first, itself = reference
        return judge(compare(first, answers), itself, self.min_agreement, note=note)

    def _wait_reference(self, timeout_s: float = REFERENCE_WAIT_S
                        ) -> tuple[Sequence[ProbeAnswer], Agreement] | None:
        """The reference, waiting while a baseline trial still runs (at most `timeout_s`)."""
        until = time.monotonic() + timeout_s
        with self._cond:
            while self._reference is None and self._baselines_running > 0:
                left = until - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return self._reference

    def _send(self, url: str, concurrency: int) -> tuple[ProbeAnswer, ...]:
        s = self.settings
        try:
            return asyncio.run(send_probe(url, str(self.sweep.spec.model), self._probe_prompts(),
                                          s.max_tokens, concurrency, s.timeout_s, self._api_key))
        except ProbeError as exc:
            raise TrialError("load_failed", f"quality probe: {exc}") from None

    def _probe_prompts(self) -> list[str]:
        with self._prompts_lock:
            if self._prompts is None:
                w = self.sweep.spec.workload
                tokenizer = load_tokenizer(w.tokenizer or self.sweep.spec.model)
                self._prompts = probe_prompts(tokenizer, self.settings)
            return self._prompts
