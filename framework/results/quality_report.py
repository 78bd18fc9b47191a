"""The report's "Output quality" section: the quality probe's numbers of every probed trial
(docs/RESULTS.md, Quality probe), as an HTML table. Pure: trial rows in, HTML out; every
string from the rows is escaped."""

from __future__ import annotations

import html
from typing import Any

import pandas as pd

_EXPLAIN = (
    "Trials that change a flag that changes outputs (kv-cache-dtype, dtype, quantization, "
    "speculative decoding, or a parameter marked <code>lossy: true</code>) answer a fixed probe "
    "set greedily after their load, and are compared with the baseline's answers: token "
    "agreement is the share of generated tokens produced before the first differing token, "
    "logprob MAD the mean |difference| of the chosen tokens' logprobs (nats) before it. The "
    "baseline answers twice (concurrency 8 and 1): its self-agreement is the noise of batching, "
    "and a trial must reach it minus 0.02, or <code>sla.min_token_agreement</code> if lower.")


def _missing(value: object) -> bool:
    return value is None or bool(pd.isna(value))


def _number(value: Any, spec: str) -> str:  # a pandas cell
    return "-" if _missing(value) else format(float(value), spec)


def _verdict(row: dict[str, Any]) -> tuple[str, str]:
    ok = row.get("quality_ok")
    if _missing(ok):
        return "unknown", "bad"
    return ("holds", "ok") if bool(ok) else ("outputs changed", "fail")


def quality_section(trials: pd.DataFrame) -> str:
    """The section's HTML: an explanation and one table row per probed trial, or a sentence
    when no trial was probed (or the rows predate the probe)."""
    if trials.empty or "token_agreement" not in trials.columns:
        return "<p>No quality probe ran in this sweep.</p>"
    probed = trials[trials["token_agreement"].notna() | trials["quality_note"].notna()]
    if probed.empty:
        return ("<p>No quality probe ran: no trial changed a flag that changes outputs (and "
                "no baseline probed).</p>")
    head = ["#", "why probed", "token agreement", "logprob MAD (nats)", "baseline self-agreement",
            "baseline self-MAD (nats)", "required", "verdict"]
    lines = [f"<p class='small'>{_EXPLAIN}</p>", "<div class='wide'><table id='quality'><thead><tr>"
             + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"]
    for _, series in probed.iterrows():
        row = series.to_dict()
        word, css = _verdict(row)
        note = "" if _missing(row.get("quality_note")) else row["quality_note"]
        baseline = "*" if row.get("is_baseline") == True else ""  # noqa: E712
        cells = [f"<td>{int(row['trial_number'])}{baseline}</td>",
                 f"<td>{html.escape(str(note), quote=False)}</td>",
                 *[f"<td class='n'>{_number(row.get(k), spec)}</td>" for k, spec in (
                     ("token_agreement", ".1%"), ("logprob_mad", ".4f"),
                     ("quality_baseline_agreement", ".1%"),
                     ("quality_baseline_logprob_mad", ".4f"), ("quality_required", ".1%"))],
                 f"<td class='{css}'>{word}</td>"]
        lines.append(f"<tr>{''.join(cells)}</tr>")
    lines.append("</tbody></table></div>")
    return "\n".join(lines)
