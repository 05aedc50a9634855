"""Pure rendering of a FederatedLearning resource (a dict, as the Kubernetes API returns it).

Used by the `ocm-fl` CLI and by the local demo: nothing here talks to a cluster.

    render_dashboard(fl)        header + cluster table (rich renderable)   `ocm-fl status`
    render_live(fl)             header + round progress bar + cluster table `ocm-fl watch`
    render_model(fl)            the model artifact, or None before there is one
    plain_lines(fl)             the dashboard as key=value lines (logs, pipes: never wrapped)
    print_dashboard(console, fl)  `ocm-fl status`: the table where it fits a terminal, else
                                plain_lines (as_table: the one rule for every table)
    print_table(console, t, rs) any table by that rule: `t`, or the records `rs`
    summary_line(fl)            one line per state, for following a run in a log
    history_figure(fl)          loss/accuracy per round per cluster (matplotlib Figure)
    plot_history(fl, path)      the same, written to an image file
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table
from rich.text import Text

from hub_controller.api import run_finished

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FL = Mapping[str, Any]
GLOBAL_SERIES: Final = "global"  # history entries of the aggregated (federated) metrics
METRICS: Final = ("loss", "accuracy")
CLUSTER_COLUMNS: Final = (
    "cluster",
    "phase",
    "data path",
    "samples",
    "round",
    "loss",
    "accuracy",
    "last report",
    "reason",
)
_PHASE_STYLE: Final = {
    "Completed": "bold green",
    "Succeeded": "green",
    "Failed": "bold red",
    "Running": "cyan",
    "Waiting": "yellow",
    "NoData": "yellow",
    "Left": "dim",
}


class NoHistoryError(ValueError):
    """The resource has no per-round metrics to plot (yet)."""


# --- facts ---------------------------------------------------------------------------------


def _status(fl: FL) -> Mapping[str, Any]:
    return fl.get("status") or {}


def _fmt(value: Any, spec: str = "") -> str:
    """A value as shown: '-' when absent, numbers with `spec`."""
    if value is None or value == "":
        return "-"
    if spec and isinstance(value, int | float) and not isinstance(value, bool):
        return format(value, spec)
    return str(value)


def full_name(fl: FL) -> str:
    meta = fl.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def total_rounds(fl: FL) -> int | None:
    """status.totalRounds, else spec.server.rounds, else None."""
    total = _status(fl).get("totalRounds") or ((fl.get("spec") or {}).get("server") or {}).get(
        "rounds"
    )
    return int(total) if isinstance(total, int | float) else None


def phase(fl: FL) -> str:
    return str(_status(fl).get("phase") or "Pending")


def summary(fl: FL) -> dict[str, str]:
    """Header facts: name, phase, round/totalRounds, clients, accuracy, message, and the
    privacy spent when the resource has differential privacy."""
    st = _status(fl)
    facts = {
        "name": full_name(fl),
        "phase": phase(fl),
        "round": f"{st.get('round') or 0}/{_fmt(total_rounds(fl))}",
        "clients": _fmt(st.get("clients")),
        "accuracy": _fmt(st.get("accuracy"), ".4f"),
        "message": str(st.get("message") or ""),
    }
    spent = st.get("privacy")
    if isinstance(spent, dict) and spent.get("epsilon") is not None:
        facts["privacy"] = (
            f"epsilon {_fmt(spent.get('epsilon'), '.4g')} at delta {_fmt(spent.get('delta'))} "
            f"after {_fmt(spent.get('rounds'))} rounds ({_fmt(spent.get('mode'))} DP)"
        )
    return facts


def _parse_time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        ts = value
    elif isinstance(value, str) and value:
        try:
            ts = datetime.fromisoformat(value)
        except ValueError:
            return None
    else:
        return None
    return ts if ts.tzinfo else ts.replace(tzinfo=UTC)


def ago(value: Any, now: datetime) -> str:
    """'12s ago', '4m ago', '2h ago', '3d ago' for an RFC 3339 time; '-' when absent."""
    ts = _parse_time(value)
    if ts is None:
        return _fmt(value)
    seconds = max(0, int((now - ts).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def cluster_rows(fl: FL, now: datetime | None = None) -> list[dict[str, str]]:
    """One row per selected cluster (keys: CLUSTER_COLUMNS), sorted by cluster name."""
    now = now or datetime.now(UTC)
    rows = []
    for c in sorted(_status(fl).get("clusters") or [], key=lambda c: str(c.get("name"))):
        rows.append(
            {
                "cluster": str(c.get("name")),
                "phase": _fmt(c.get("phase")),
                "data path": _fmt(c.get("dataPath")),
                "samples": _fmt(c.get("samples")),
                "round": _fmt(c.get("round")),
                "loss": _fmt(c.get("loss"), ".4f"),
                "accuracy": _fmt(c.get("accuracy"), ".4f"),
                "last report": ago(c.get("lastReportTime"), now),
                "reason": str(c.get("reason") or ""),
            }
        )
    return rows


def problem_conditions(fl: FL) -> list[dict[str, str]]:
    """Conditions whose status is not True (type, status, reason, message)."""
    return [
        {
            "type": str(c.get("type")),
            "status": str(c.get("status")),
            "reason": str(c.get("reason") or ""),
            "message": str(c.get("message") or ""),
        }
        for c in _status(fl).get("conditions") or []
        if str(c.get("status")) != "True"
    ]


def model_info(fl: FL) -> dict[str, Any] | None:
    """status.model (path, round, sha256, metrics), or None before there is one."""
    model = _status(fl).get("model")
    return dict(model) if model else None


def finished(fl: FL) -> bool:
    """The run ended (hub_controller.api.run_finished on the resource as read)."""
    status = _status(fl)
    generation = (fl.get("metadata") or {}).get("generation")
    return run_finished(status.get("phase"), status.get("observedGeneration"), generation)


# --- plain lines (not a terminal) ----------------------------------------------------------


def logfmt(pairs: Iterable[tuple[str, str]]) -> str:
    """key=value pairs, empty values left out; values with spaces, quotes, '=' or line
    breaks are JSON-quoted (a record is always one line)."""
    out = []
    for key, value in pairs:
        if not value:
            continue
        if any(c in value for c in ' "=\t\n\r'):
            value = json.dumps(value)
        out.append(f"{key.replace(' ', '-')}={value}")
    return " ".join(out)


def summary_line(fl: FL) -> str:
    """`<ns/name> phase=... round=... clients=... accuracy=... message=...`."""
    s = summary(fl)
    pairs = [(k, s[k]) for k in ("phase", "round", "clients", "accuracy", "message")]
    return f"{s['name']} {logfmt(pairs)}"


def plain_lines(fl: FL, now: datetime | None = None) -> list[str]:
    """What `ocm-fl status` prints when stdout is not a terminal: the summary line, one line
    per condition that is not True, one line per cluster; nothing wraps or folds."""
    lines = [summary_line(fl)]
    for cond in problem_conditions(fl):
        lines.append(
            logfmt(
                [
                    ("condition", cond["type"]),
                    *((k, cond[k]) for k in ("status", "reason", "message")),
                ]
            )
        )
    rows = cluster_rows(fl, now)
    lines += [logfmt(row.items()) for row in rows]
    if not rows:
        lines.append("no clusters selected yet")
    return lines


# --- rich renderables ----------------------------------------------------------------------


def _styled_phase(value: str) -> Text:
    return Text(value, style=_PHASE_STYLE.get(value, ""))


def render_header(fl: FL) -> RenderableType:
    """Name, phase, round/total, clients, accuracy, message and the conditions not True."""
    s = summary(fl)
    parts: list[RenderableType] = [
        Text.assemble(
            (s["name"], "bold"),
            "  phase ",
            _styled_phase(s["phase"]),
            f"  round {s['round']}  clients {s['clients']}  accuracy {s['accuracy']}",
            overflow="ignore",
        )
    ]
    if s["message"]:
        parts.append(Text(s["message"], style="dim", overflow="ignore"))
    if "privacy" in s:
        parts.append(Text(f"privacy spent: {s['privacy']}", overflow="ignore"))
    for cond in problem_conditions(fl):
        line = Text.assemble(
            ("! ", "yellow"),
            (cond["type"], "bold"),
            f"={cond['status']} ",
            cond["reason"],
            overflow="ignore",  # wrapped between words only; a longer word is not cut
        )
        if cond["message"]:
            line.append(f": {cond['message']}")
        parts.append(line)
    return Group(*parts)


def render_clusters(fl: FL, now: datetime | None = None) -> Table:
    """The cluster table (one row per selected cluster). Only `reason` wraps (between words):
    a table with one wrapping column keeps every word whole whenever table_fits says so."""
    table = Table(title="clusters", title_justify="left")
    for col in CLUSTER_COLUMNS:
        numeric = col in ("samples", "round", "loss", "accuracy")
        table.add_column(col, justify="right" if numeric else "left", no_wrap=col != "reason")
    rows = cluster_rows(fl, now)
    for row in rows:
        table.add_row(*(_styled_phase(v) if k == "phase" else v for k, v in row.items()))
    if not rows:
        table.caption = "no clusters selected yet"
    return table


def render_dashboard(fl: FL, now: datetime | None = None) -> RenderableType:
    """What `ocm-fl status` prints on a terminal: the header and the cluster table."""
    return Group(render_header(fl), render_clusters(fl, now))


# --- tables or records: the one rule -------------------------------------------------------

_UNBOUNDED = 1_000_000


def _plain(cell: Any) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)


def table_fits(console: Console, table: Table, width: int | None = None) -> bool:
    """The table can be drawn in `width` columns (default: the console's) with no cell cut
    or folded: its no_wrap columns whole, and its one wrapping column (if any) wrapped
    between words only. With several wrapping columns, rich may narrow one below its
    longest word, so then the whole table must fit unwrapped."""
    for column in table.columns:  # rich measures a no_wrap cell's minimum as its longest word
        if column.no_wrap and column.min_width is None:
            cells = [column.header, *column.cells]
            column.min_width = max(cell_len(_plain(c)) for c in cells)
    natural = Measurement.get(console, console.options.update_width(_UNBOUNDED), table)
    wrapping = sum(not column.no_wrap for column in table.columns)
    needed = natural.minimum if wrapping <= 1 else natural.maximum
    return needed <= (width or console.width)


def as_table(console: Console, table: Table) -> bool:
    """The rule for every table `ocm-fl` and the demo print: a table only on a terminal wide
    enough for it (table_fits); otherwise (a pipe, a log, a narrow terminal) records, one per
    line. Off a terminal the answer is records even when COLUMNS gives a width: scripts get
    the same lines wherever they run."""
    return console.is_terminal and table_fits(console, table)


def print_lines(console: Console, lines: Iterable[str]) -> None:
    """Each line as one line: never wrapped or folded by rich, however narrow the console (a
    terminal may still show a long one over two rows; copied, it is whole)."""
    for line in lines:
        console.print(Text(line, no_wrap=True, overflow="ignore"), soft_wrap=True)


def print_table(console: Console, table: Table, records: Iterable[str]) -> None:
    """`table` where as_table() says so, else `records` (e.g. logfmt lines) via print_lines."""
    if as_table(console, table):
        console.print(table)
    else:
        print_lines(console, records)


def print_dashboard(console: Console, fl: FL, now: datetime | None = None) -> None:
    """`ocm-fl status` (and the demo's final view): render_dashboard where the cluster table
    fits a terminal, else plain_lines."""
    table = render_clusters(fl, now)
    if as_table(console, table):
        console.print(Group(render_header(fl), table))
    else:
        print_lines(console, plain_lines(fl, now))


def render_progress(fl: FL) -> Progress:
    """A progress bar of rounds: round / totalRounds."""
    progress = Progress(
        TextColumn("rounds"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}")
    )
    done = int(_status(fl).get("round") or 0)
    progress.add_task(phase(fl), total=total_rounds(fl), completed=done)
    return progress


def render_live(fl: FL, now: datetime | None = None) -> RenderableType:
    """What `ocm-fl watch` shows: header, round progress bar, cluster table."""
    return Group(render_header(fl), render_progress(fl), render_clusters(fl, now))


@dataclass
class LiveView:
    """Holds the latest resource; re-rendered at each refresh so 'ago' times keep moving.
    Where the cluster table does not fit, the clusters are records cut at the edge with '…'
    (a live display cannot show a line longer than the screen): print the records after
    the live display ends (print_lines) for the whole of them."""

    fl: FL

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        now = datetime.now(UTC)
        table = render_clusters(self.fl, now)
        if table_fits(console, table, options.max_width):
            yield Group(render_header(self.fl), render_progress(self.fl), table)
            return
        records = [
            Text(line, no_wrap=True, overflow="ellipsis") for line in plain_lines(self.fl, now)[1:]
        ]
        yield Group(render_header(self.fl), render_progress(self.fl), *records)


def render_model(fl: FL) -> Text | None:
    """The model artifact as `key  value` lines (never folded: paths and digests stay
    copyable), or None when status.model is not set."""
    info = model_info(fl)
    if info is None:
        return None
    lines = [("path", _fmt(info.get("path"))), ("round", _fmt(info.get("round")))]
    lines.append(("sha256", _fmt(info.get("sha256"))))
    lines += [
        (f"metrics.{k}", _fmt(v, ".4f")) for k, v in sorted((info.get("metrics") or {}).items())
    ]
    width = max(len(k) for k, _ in lines)
    text = Text(f"model of {full_name(fl)}\n", style="bold", no_wrap=True, overflow="ignore")
    for key, value in lines:
        text.append(f"  {key.ljust(width)}  ", style="bold")
        text.append(f"{value}\n", style="")
    text.rstrip()
    return text


# --- per-round history ---------------------------------------------------------------------

Series = dict[str, dict[str, list[tuple[int, float]]]]


def history_series(fl: FL) -> Series:
    """{metric: {cluster: [(round, value), ...] sorted by round}} from status.history.

    Entries without a value for a metric are left out of that metric; a repeated
    (round, cluster) keeps the last entry.
    """
    points: dict[str, dict[str, dict[int, float]]] = {m: {} for m in METRICS}
    for entry in _status(fl).get("history") or []:
        rnd, cluster = entry.get("round"), entry.get("cluster")
        if not isinstance(rnd, int) or isinstance(rnd, bool) or not cluster:
            continue
        for metric in METRICS:
            value = entry.get(metric)
            if isinstance(value, int | float) and not isinstance(value, bool):
                points[metric].setdefault(str(cluster), {})[rnd] = float(value)
    return {
        metric: {c: sorted(by_round.items()) for c, by_round in sorted(per.items())}
        for metric, per in points.items()
    }


def history_figure(fl: FL) -> Figure:
    """Two subplots, loss and accuracy per round, one line per cluster ('global' dashed).

    Raises NoHistoryError when status.history holds no loss or accuracy values.
    """
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    series = history_series(fl)
    if not any(series.values()):
        s = summary(fl)
        raise NoHistoryError(
            f"no per-round metrics yet: status.history of {s['name']} is empty "
            f"(phase {s['phase']}, round {s['round']})"
        )
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    axes = fig.subplots(1, 2)
    for ax, metric in zip(axes, METRICS, strict=True):
        lines = series[metric]
        for cluster, pts in lines.items():
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            if cluster == GLOBAL_SERIES:
                ax.plot(xs, ys, "k--", marker="s", linewidth=2.2, label="global", zorder=3)
            else:
                ax.plot(xs, ys, marker="o", label=cluster)
        ax.set_title(f"{metric} per round")
        ax.set_xlabel("round")
        ax.set_ylabel(metric)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
        if lines:
            ax.legend(fontsize="small")
        else:
            ax.text(
                0.5, 0.5, f"no {metric} reported", ha="center", va="center", transform=ax.transAxes
            )
    s = summary(fl)
    fig.suptitle(f"{s['name']}  {s['phase']}  round {s['round']}")
    return fig


def plot_history(fl: FL, path: str | Path) -> Path:
    """Write history_figure(fl) to `path` (format from the suffix: .png, .svg, .pdf ...)."""
    out = Path(path)
    history_figure(fl).savefig(out)
    return out
