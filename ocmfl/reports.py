"""Status reports: validation and enum names, shared by the agent and the hub aggregator.

Protobuf stays at this edge: the agent builds `Report` messages, the hub validates them
with `validate_report` and folds them into its report store (hub_controller.aggregator.store),
keyed by `fl_uid`: a report must name the run (the resource's uid) it belongs to.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Iterable
from typing import Final, TypeAlias

from ocmfl.pki import is_valid_cluster_name
from ocmfl.podproblem import MAX_PROBLEM
from ocmfl.status.v1 import report_pb2

MAX_METRICS_PER_REPORT: Final = 1000
MAX_HISTOGRAM_LABELS: Final = 1000
MAX_ROUND: Final = 1_000_000
MAX_FUTURE_SKEW: Final = dt.timedelta(minutes=5)
MAX_SAMPLES: Final = 2**53
# A failed client's log tail (Report.client_log): at most this many characters, lines cut at
# MAX_LOG_LINE, printable text plus newlines and tabs only (client_log_tail makes it so).
MAX_CLIENT_LOG: Final = 4096
MAX_LOG_LINE: Final = 300
# Terminal colour and cursor codes (ANSI CSI): Flower colours its log levels; they go.
_ANSI_CSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_UNPRINTABLE = re.compile(r"[^\t\n\x20-\x7e\u00a0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")

_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_UID = re.compile(r"^[0-9A-Za-z._-]{1,128}$")
_LABEL = re.compile(r"^[^\x00-\x1f]{1,63}$")

ClientPhase: TypeAlias = report_pb2.ClientPhase.ValueType
RoundPhase: TypeAlias = report_pb2.RoundPhase.ValueType

CLIENT_PHASE_NAMES: Final[dict[ClientPhase, str]] = {
    report_pb2.CLIENT_PHASE_UNSPECIFIED: "Unknown",
    report_pb2.CLIENT_PHASE_PENDING: "Pending",
    report_pb2.CLIENT_PHASE_RUNNING: "Running",
    report_pb2.CLIENT_PHASE_SUCCEEDED: "Succeeded",
    report_pb2.CLIENT_PHASE_FAILED: "Failed",
}
ROUND_PHASE_NAMES: Final[dict[RoundPhase, str]] = {
    report_pb2.ROUND_PHASE_FIT: "fit",
    report_pb2.ROUND_PHASE_EVALUATE: "evaluate",
}
ROUND_PHASES_BY_NAME: Final[dict[str, RoundPhase]] = {v: k for k, v in ROUND_PHASE_NAMES.items()}


class ReportInvalid(ValueError):
    """A report field is malformed; `field` names it (e.g. ``metrics[2].accuracy``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def _escape(match: re.Match[str]) -> str:
    return ascii(match.group())[1:-1] or "?"


def client_log_tail(lines: Iterable[str], limit: int = MAX_CLIENT_LOG) -> str:
    """The last lines of a client's log that fit `limit` characters, safe to carry in a report
    and show anywhere: terminal colour codes removed, control and other unprintable
    characters escaped (\\x1b, \\x00),
    each line cut at MAX_LOG_LINE characters ("[... N characters cut]"), and a first line
    that says how many earlier lines were left out."""
    kept: list[str] = []
    size = 0
    all_lines = [part for ln in lines for part in ln.rstrip("\r\n").split("\n")]
    for line in reversed(all_lines):
        line = _UNPRINTABLE.sub(_escape, _ANSI_CSI.sub("", line))
        if len(line) > MAX_LOG_LINE:
            cut = len(line) - MAX_LOG_LINE
            line = f"{line[:MAX_LOG_LINE]}[... {cut} characters cut]"
        note = len(f"[{len(all_lines)} earlier lines cut]\n")
        if size + len(line) + 1 + note > limit:
            break
        kept.append(line)
        size += len(line) + 1
    left_out = len(all_lines) - len(kept)
    head = [f"[{left_out} earlier lines cut]"] if left_out else []
    return "\n".join(head + kept[::-1])


def is_valid_namespace(name: str) -> bool:
    return bool(_NAMESPACE.match(name))


def is_valid_object_name(name: str) -> bool:
    return bool(_SUBDOMAIN.match(name)) and ".." not in name


def _finite(field: str, value: float) -> None:
    if not math.isfinite(value):
        raise ReportInvalid(field, "must be a finite number")


def validate_metrics(m: report_pb2.RoundMetrics, field: str) -> None:
    """Check one RoundMetrics row; raise ReportInvalid naming the bad field."""
    if not 1 <= m.round <= MAX_ROUND:
        raise ReportInvalid(f"{field}.round", f"must be within [1, {MAX_ROUND}]")
    if m.phase not in ROUND_PHASE_NAMES:
        raise ReportInvalid(f"{field}.phase", "must be fit or evaluate")
    if m.HasField("loss"):
        _finite(f"{field}.loss", m.loss)
    if m.HasField("accuracy"):
        _finite(f"{field}.accuracy", m.accuracy)
        if not 0.0 <= m.accuracy <= 1.0:
            raise ReportInvalid(f"{field}.accuracy", "must be within [0, 1]")
    if m.samples > MAX_SAMPLES:
        raise ReportInvalid(f"{field}.samples", "is too large")
    _finite(f"{field}.duration_s", m.duration_s)
    if m.duration_s < 0:
        raise ReportInvalid(f"{field}.duration_s", "must not be negative")


def validate_report(report: report_pb2.Report, now: dt.datetime | None = None) -> None:
    """Check every field of a report; raise ReportInvalid naming the first bad one."""
    if not is_valid_cluster_name(report.cluster):
        raise ReportInvalid("cluster", "must be a cluster name (RFC 1123 label)")
    if not is_valid_namespace(report.fl_namespace):
        raise ReportInvalid("fl_namespace", "must be a namespace name (RFC 1123 label)")
    if not is_valid_object_name(report.fl_name):
        raise ReportInvalid("fl_name", "must be an object name (RFC 1123 subdomain)")
    if not _UID.match(report.fl_uid):
        raise ReportInvalid("fl_uid", "must be the FederatedLearning's metadata.uid")
    if report.client_phase not in CLIENT_PHASE_NAMES or not report.client_phase:
        raise ReportInvalid("client_phase", "must be a known phase other than UNSPECIFIED")
    if report.round > MAX_ROUND:
        raise ReportInvalid("round", f"must be at most {MAX_ROUND}")
    if len(report.metrics) > MAX_METRICS_PER_REPORT:
        raise ReportInvalid("metrics", f"at most {MAX_METRICS_PER_REPORT} rows")
    for i, m in enumerate(report.metrics):
        validate_metrics(m, f"metrics[{i}]")
    if report.HasField("data"):
        if report.data.sample_count > MAX_SAMPLES:
            raise ReportInvalid("data.sample_count", "is too large")
        hist = report.data.label_histogram
        if len(hist) > MAX_HISTOGRAM_LABELS:
            raise ReportInvalid("data.label_histogram", f"at most {MAX_HISTOGRAM_LABELS} labels")
        for label, count in hist.items():
            if not _LABEL.match(label):
                raise ReportInvalid(f"data.label_histogram[{label[:20]!r}]", "bad label")
            if count < 0:
                raise ReportInvalid(f"data.label_histogram[{label!r}]", "must not be negative")
    if len(report.client_problem) > MAX_PROBLEM:
        raise ReportInvalid("client_problem", f"at most {MAX_PROBLEM} characters")
    if len(report.client_log) > MAX_CLIENT_LOG:
        raise ReportInvalid("client_log", f"at most {MAX_CLIENT_LOG} characters")
    if _UNPRINTABLE.search(report.client_log):
        raise ReportInvalid("client_log", "only printable text, newlines and tabs")
    if len(report.agent_version) > 64:
        raise ReportInvalid("agent_version", "at most 64 characters")
    if not report.HasField("timestamp"):
        raise ReportInvalid("timestamp", "is required")
    now = now or dt.datetime.now(dt.UTC)
    ts = report.timestamp.ToDatetime(tzinfo=dt.UTC)
    if ts > now + MAX_FUTURE_SKEW:
        raise ReportInvalid("timestamp", "is in the future")
    if report.sequence < 1:
        raise ReportInvalid("sequence", "must be at least 1")
