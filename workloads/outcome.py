"""How one run of an app ends, for any app: the pure part of ``ocm-fl-server``.

Inputs: Flower's final run status, the model store's manifest, and what the run's log said
(``RunLog``: rounds started, client errors, result counts, and each round's aggregated
metrics as Flower's strategies log them). Output: ``Outcome`` (ok, a one-line reason, rounds
done, the final model's location, sha256 and metrics, and the per-round history the log
showed: any app's progress, with or without the SDK).

- Flower says failed/stopped: Failed, with the app's own error text (trimmed).
- Completed with a final model of this resource in the store: Completed, unless fewer rounds
  than asked for were run.
- Completed without a stored model (an app that does not use the SDK's store): Failed when
  the log shows a round with fewer successful results than the minimum (the ClientApp
  raised; Flower still says "completed"), else Completed with the rounds the log shows and no
  model.
"""

from __future__ import annotations

import ast
import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

REASON_LIMIT = 400
_ROUND = re.compile(r"\[ROUND (\d+)/(\d+)\]")
_RESULTS = re.compile(r"(aggregate_\w+): Received (\d+) results and (\d+) failures")
_REPLY_ERROR = re.compile(r"Received error in reply from node (\d+): (.*)$")
_FLOWER_REASON = re.compile(r"<class '(?:[\w.]+\.)?(\w+)'>:<'(.*?)'>", re.S)
# Flower's strategies (flwr.serverapp.strategy) after each aggregation, and after the
# ServerApp-side evaluation ("Global evaluation"): "└──> [Aggregated ]MetricRecord: {...}".
_METRICS = re.compile(r"└──> (?:Aggregated )?MetricRecord: (\{.*\})\s*$")
_METRICS_TEXT_LIMIT = 4000  # a longer record is not parsed (an app logging arrays)
# The termination message is at most 4096 bytes (kubelet cuts the rest): the history it
# carries is the latest rounds that fit in this many bytes.
HISTORY_BYTES = 2000


def one_line(text: str, limit: int = REASON_LIMIT) -> str:
    """Collapse whitespace so a reason fits on one line, trimmed to ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def readable_error(text: str) -> str:
    """Flower's "<class 'mod.ValueError'>:<'msg'>" spelled "ValueError: msg"."""
    return _FLOWER_REASON.sub(lambda m: f"{m.group(1)}: {m.group(2)}", text)


@dataclass
class RunLog:
    """What a run's log (``flwr log --stream``) tells about it, fed line by line."""

    min_results: int = 1
    rounds_started: int = 0
    client_errors: list[str] = field(default_factory=list)
    short_rounds: list[str] = field(default_factory=list)  # "aggregate_train: 0 results"
    # round -> phase (train, evaluate, server) -> the numeric metrics Flower logged
    round_metrics: dict[int, dict[str, dict[str, float]]] = field(default_factory=dict)
    _round: int = 0
    _phase: str = ""

    def feed(self, line: str) -> None:
        """Take one log line."""
        if m := _ROUND.search(line):
            self.rounds_started = max(self.rounds_started, int(m.group(1)))
            self._round, self._phase = int(m.group(1)), ""
        if "Global evaluation" in line:
            self._phase = "server"
        if (m := _METRICS.search(line)) and self._round and self._phase:
            metrics = _numbers_from_text(m.group(1))
            if metrics:
                self.round_metrics.setdefault(self._round, {})[self._phase] = metrics
        if m := _REPLY_ERROR.search(line):
            error = readable_error(m.group(2).strip())
            if error not in self.client_errors:
                self.client_errors.append(error)
        if m := _RESULTS.search(line):
            self._phase = "train" if m.group(1) == "aggregate_train" else "evaluate"
            results, failures = int(m.group(2)), int(m.group(3))
            if failures and results < self.min_results:
                self.short_rounds.append(f"{m.group(1)}: {results} results, {failures} failures")

    def history(self) -> list[dict[str, float | int]]:
        """One row per round the log showed metrics for: `round`, and `loss` and `accuracy`
        when a metric name says so (server-side evaluation over the clients' evaluate over
        their train values, as final_metrics chooses)."""
        rows: list[dict[str, float | int]] = []
        for rnd in sorted(self.round_metrics):
            phases = self.round_metrics[rnd]
            row: dict[str, float | int] = {"round": rnd}
            for key, marker in (("loss", "loss"), ("accuracy", "acc")):
                for phase in ("server", "evaluate", "train"):
                    names = sorted(k for k in phases.get(phase, {}) if marker in k.lower())
                    if names:
                        row[key] = round(phases[phase][names[0]], 6)
                        break
            if len(row) > 1:
                rows.append(row)
        return rows


def _numbers_from_text(text: str) -> dict[str, float]:
    """The numeric entries of a logged MetricRecord ("{'loss': 0.5, ...}"); {} when it is not
    a plain literal dict or too long."""
    if len(text) > _METRICS_TEXT_LIMIT:
        return {}
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return {}
    return _numbers(value)


def fitting_history(rows: list[dict[str, float | int]], limit: int = HISTORY_BYTES) -> list[Any]:
    """The latest rows whose JSON fits in `limit` bytes (the termination message's room)."""
    kept: list[dict[str, float | int]] = []
    size = 2
    for row in reversed(rows):
        size += len(json.dumps(row, separators=(",", ":"))) + 1
        if size > limit:
            break
        kept.append(row)
    return kept[::-1]


@dataclass(frozen=True)
class Outcome:
    """How the launcher ends: ok (exit 0) or not, a one-line reason and what was produced."""

    ok: bool
    reason: str
    rounds: int | None = None
    model_path: str | None = None
    sha256: str | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    details: Mapping[str, Any] = field(default_factory=dict)
    history: tuple[Mapping[str, float | int], ...] = ()
    privacy: Mapping[str, Any] = field(default_factory=dict)  # spent, as the store recorded

    def termination_message(self) -> dict[str, Any]:
        """What the server container leaves in its termination message (read by the hub)."""
        out: dict[str, Any] = {"ok": self.ok, "reason": one_line(self.reason)}
        if self.rounds is not None:
            out["round"] = self.rounds
        if self.model_path:
            out["path"] = self.model_path
            out["sha256"] = self.sha256
        if self.metrics:
            out["metrics"] = dict(self.metrics)
        if self.privacy:
            out["privacy"] = dict(self.privacy)
        if self.history:
            out["history"] = fitting_history([dict(row) for row in self.history])
        return out


def privacy_spent(manifest: Mapping[str, Any] | None) -> dict[str, Any]:
    """The privacy the run spent (workloads.sdk.privacy.spent), from the final model's
    metrics, else the newest checkpoint's; empty without spec.privacy."""
    final = (manifest or {}).get("final")
    checkpoints = (manifest or {}).get("checkpoints")
    entries = [final] + (list(reversed(checkpoints)) if isinstance(checkpoints, list) else [])
    for entry in entries:
        metrics = entry.get("metrics") if isinstance(entry, Mapping) else None
        spent = metrics.get("privacy") if isinstance(metrics, Mapping) else None
        if isinstance(spent, Mapping):
            return dict(spent)
    return {}


def _numbers(metrics: Any) -> dict[str, float]:
    if not isinstance(metrics, Mapping):
        return {}
    return {
        str(k): float(v)
        for k, v in metrics.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }


def final_metrics(entry_metrics: Mapping[str, Any]) -> dict[str, float]:
    """The final model's metrics: server-side evaluation when the app has one, else the
    clients' evaluate (then train) metrics, weighted by their num-examples."""
    server = _numbers(entry_metrics.get("server"))
    if server:
        return server
    for phase in ("evaluate", "train"):
        per_cluster = entry_metrics.get(phase)
        if not isinstance(per_cluster, Mapping) or not per_cluster:
            continue
        rows = [_numbers(m) for m in per_cluster.values()]
        weights = [r.get("num-examples", 1.0) for r in rows]
        total = sum(weights) or 1.0
        keys = set.intersection(*(set(r) for r in rows)) - {"num-examples"}
        return {k: sum(r[k] * w for r, w in zip(rows, weights, strict=True)) / total for k in keys}
    return {}


def decide(
    status: Mapping[str, Any],
    manifest: Mapping[str, Any] | None,
    run_log: RunLog,
    *,
    rounds: int | None,
    uid: str,
    model_url: str | None,
) -> Outcome:
    """The outcome of a finished run (see the module docstring), with the per-round history
    its log showed. ``model_url`` is where the manifest's final entry lives (None when there
    is none)."""
    # Every outcome carries the run's status (details) and the per-round history.
    outcome = functools.partial(
        Outcome,
        details=status,
        history=tuple(run_log.history()),
        privacy=privacy_spent(manifest),
    )
    state = str(status.get("status", ""))
    run_id = status.get("run-id")
    errors = "; ".join(run_log.client_errors)
    if state != "finished:completed":
        details = readable_error(str(status.get("status-details") or ""))
        reason = f"run {run_id} {state}: {details or 'no details from Flower'}"
        if errors and errors not in reason:
            reason += f"; client errors: {errors}"
        return outcome(False, one_line(reason), run_log.rounds_started or None)
    final = (manifest or {}).get("final")
    if isinstance(final, Mapping) and final.get("uid", "") == uid and model_url:
        done = int(final.get("round", 0))
        if rounds is not None and done < rounds:
            return outcome(
                False,
                f"run {run_id} completed but its final model is from round {done} of {rounds}",
                done,
            )
        metrics = final_metrics(final.get("metrics") or {})
        shown = ", ".join(f"{k} {v:.4f}" for k, v in sorted(metrics.items())[:4])
        return outcome(
            True,
            one_line(
                f"run {run_id} completed {done} rounds; final model {model_url} sha256 "
                f"{str(final.get('sha256'))[:12]}" + (f"; {shown}" if shown else "")
            ),
            done,
            model_url,
            str(final.get("sha256")),
            metrics,
        )
    if run_log.short_rounds:
        reason = (
            f"run {run_id}: a round got fewer than {run_log.min_results} successful client "
            f"results ({run_log.short_rounds[0]}): {errors or 'no client error text'}"
        )
        return outcome(False, one_line(reason), run_log.rounds_started or None)
    done_rounds = run_log.rounds_started or None
    reason = (
        f"run {run_id} completed"
        + (f" {done_rounds} rounds" if done_rounds else "")
        + "; the app stored no final model (workloads.sdk.run_strategy stores one)"
    )
    return outcome(True, reason, done_rounds)
