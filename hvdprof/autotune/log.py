"""The autotune log (HVDPROF_AUTOTUNE_LOG): one CSV row per scored sample.

The log is what a user reads to see what the tuner tried, and what a later run reads
back (HVDPROF_AUTOTUNE_WARM_START) to start where this one left off. Two properties
matter more than anything else:

* Every column states its unit in its name (Horovod's log puts the threshold in MB and
  the score in bytes/us with no hint of either).
* The file is well formed at every instant, even if the job is SIGKILLed: the header is
  written when the log opens, and each row is one ``os.write`` of a complete line on an
  ``O_APPEND`` descriptor followed by ``fsync``. A reader therefore sees the header and
  whole rows, plus at worst one torn last line (a crash of the file system or a full disk),
  which ``read_autotune_log`` skips.

Rows are written by the controller's worker thread, never by the cycle thread, so the
fsync costs training nothing.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from hvdprof.common.records import TunableParams

_log = logging.getLogger("hvdprof.autotune")

#: the header, in order; units are part of the names
LOG_COLUMNS: tuple[str, ...] = (
    "fusion_threshold_bytes",
    "cycle_time_ms",
    "cache_enabled",
    "score_bytes_per_s",
    "first_step",
    "last_step",
    "unix_time",
    "is_best",
    "phase",
    "role",
    "ratio_to_default",
    "while_tuning_ratio",
)

#: ``phase`` values: a sample the optimizer asked for, a re-measurement of the best
#: configuration while watching for drift (continuous mode), or the round's decision (one
#: row at the end of each round: the configuration chosen, ``role`` saying whether the
#: default was kept, ``ratio_to_default`` the confirmed gain; not a measured window)
PHASE_TUNE = "tune"
PHASE_WATCH = "watch"
PHASE_DECISION = "decision"

#: ``role`` values: while tuning, windows alternate between the incumbent and a candidate
#: (see ``tuner``); a watch row re-measures the recommendation
ROLE_INCUMBENT = "incumbent"
ROLE_CANDIDATE = "candidate"
ROLE_WATCH = "watch"
#: ``role`` of a decision row
ROLE_RECOMMENDED = "recommended"
ROLE_KEPT = "kept_default"

_REQUIRED = ("fusion_threshold_bytes", "cycle_time_ms", "cache_enabled", "score_bytes_per_s")


@dataclass(frozen=True, slots=True)
class TrialRow:
    """One scored sample, as written to (and read back from) the log."""

    params: TunableParams
    score_bytes_per_s: float
    first_step: int
    last_step: int
    unix_time: float
    is_best: bool
    phase: str = PHASE_TUNE
    role: str = ""
    #: the tuner's paired estimate of this configuration's throughput relative to the
    #: default when the row was written (1.1 = 10% faster); None before any comparison
    ratio_to_default: float | None = None
    #: the round's throughput so far against the default's, by the paired estimates of
    #: what its windows ran (0.95: exploring has cost the job 5% so far); None outside a
    #: round
    while_tuning_ratio: float | None = None

    def to_line(self) -> str:
        """The CSV line for this row, newline included."""
        p = self.params
        fields = (
            str(int(p.fusion_threshold_bytes)),
            f"{p.cycle_time_ms:g}",
            "1" if p.cache_enabled else "0",
            f"{self.score_bytes_per_s:.6g}",
            str(self.first_step),
            str(self.last_step),
            f"{self.unix_time:.3f}",
            "1" if self.is_best else "0",
            self.phase,
            self.role,
            "" if self.ratio_to_default is None else f"{self.ratio_to_default:.6g}",
            "" if self.while_tuning_ratio is None else f"{self.while_tuning_ratio:.4g}",
        )
        return ",".join(fields) + "\n"


class AutotuneTrialLog:
    """Append-only CSV writer whose file is valid after any crash (see the module doc).

    Opening truncates an existing file: a log describes one run. (The controller reads a
    warm-start file before opening its log, so both may name the same path.)
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if self.path.parent and not self.path.parent.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(
            self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644
        )
        self.rows_written = 0
        self._write(",".join(LOG_COLUMNS) + "\n")

    def write(self, row: TrialRow) -> None:
        """Append one row and make it durable before returning."""
        self._write(row.to_line())
        self.rows_written += 1

    def _write(self, line: str) -> None:
        if self._fd is None:
            raise ValueError(f"autotune log {self.path} is closed")
        data = line.encode("utf-8")
        written = os.write(self._fd, data)
        if written != len(data):  # a regular file only writes short when the disk is full
            raise OSError(f"short write to autotune log {self.path} ({written}/{len(data)})")
        os.fsync(self._fd)

    def flush(self) -> None:
        """Rows are durable as soon as written; kept for symmetry with other sinks."""
        if self._fd is not None:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.fsync(fd)
            os.close(fd)

    def __enter__(self) -> AutotuneTrialLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_row(
    params: TunableParams,
    score_bytes_per_s: float,
    first_step: int,
    last_step: int,
    is_best: bool,
    phase: str = PHASE_TUNE,
    unix_time: float | None = None,
    role: str = "",
    ratio_to_default: float | None = None,
    while_tuning_ratio: float | None = None,
) -> TrialRow:
    """A row stamped with the current time (or ``unix_time``)."""
    return TrialRow(
        params=params,
        score_bytes_per_s=float(score_bytes_per_s),
        first_step=int(first_step),
        last_step=int(last_step),
        unix_time=time.time() if unix_time is None else unix_time,
        is_best=is_best,
        phase=phase,
        role=role,
        ratio_to_default=None if ratio_to_default is None else float(ratio_to_default),
        while_tuning_ratio=None if while_tuning_ratio is None else float(while_tuning_ratio),
    )


def _parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _parse_optional_float(text: str) -> float | None:
    return float(text) if text.strip() else None


def read_autotune_log(path: str | os.PathLike[str]) -> list[TrialRow]:
    """Every complete row of an autotune log, in file order.

    Columns are found by header name, so logs with extra or reordered columns read fine.
    A last line without its newline (torn by a crash) is skipped, as is any malformed
    row; each skip is logged with its line number and reason rather than dropped silently.
    Raises ``ValueError`` when the header lacks a required column.
    """
    return _read_rows(path)[0]


def _read_rows(path: str | os.PathLike[str]) -> tuple[list[TrialRow], list[tuple[int, str]]]:
    """:func:`read_autotune_log`'s rows, and the decision rows after the last whole one
    that it skipped as malformed (line number, why): a damaged decision is not "no
    decision", nor is an earlier round's the one to use."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    torn = lines.pop()  # "" when the file ends in a newline, else a partial last line
    if torn:
        _log.warning("autotune log %s: skipped a truncated last line %r", path, torn[:80])
    if not lines:
        return [], []
    header = [h.strip() for h in lines[0].split(",")]
    missing = [c for c in _REQUIRED if c not in header]
    if missing:
        raise ValueError(f"{path} is not an autotune log: header lacks {', '.join(missing)}")
    col = {name: i for i, name in enumerate(header)}
    rows: list[TrialRow] = []
    bad_decisions: list[tuple[int, str]] = []
    for lineno, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = line.split(",")
        try:
            if len(fields) != len(header):
                raise ValueError(f"{len(fields)} fields, header has {len(header)}")

            def get(name: str, default: str, fields: list[str] = fields) -> str:
                return fields[col[name]] if name in col else default

            params = TunableParams(
                fusion_threshold_bytes=int(get("fusion_threshold_bytes", "")),
                cycle_time_ms=float(get("cycle_time_ms", "")),
                cache_enabled=_parse_bool(get("cache_enabled", "")),
            )
            rows.append(
                TrialRow(
                    params=params,
                    score_bytes_per_s=float(get("score_bytes_per_s", "")),
                    first_step=int(get("first_step", "-1")),
                    last_step=int(get("last_step", "-1")),
                    unix_time=float(get("unix_time", "0")),
                    is_best=_parse_bool(get("is_best", "0")),
                    phase=get("phase", PHASE_TUNE).strip() or PHASE_TUNE,
                    role=get("role", "").strip(),
                    ratio_to_default=_parse_optional_float(get("ratio_to_default", "")),
                    while_tuning_ratio=_parse_optional_float(get("while_tuning_ratio", "")),
                )
            )
            if rows[-1].phase == PHASE_DECISION:
                bad_decisions.clear()
        except ValueError as exc:
            _log.warning("autotune log %s line %d skipped: %s", path, lineno, exc)
            if PHASE_DECISION in (f.strip() for f in fields):
                bad_decisions.append((lineno, str(exc)))
    return rows, bad_decisions


def read_decision(path: str | os.PathLike[str]) -> TrialRow:
    """The last round's decision row of an autotune log (what ``hvdprof run
    --autotune-from`` starts a job from). Raises ``ValueError`` naming the file when it has
    none (a log from a job that ended while tuning, or from before decision rows)."""
    rows, bad_decisions = _read_rows(path)
    decisions = [r for r in rows if r.phase == PHASE_DECISION]
    if bad_decisions:
        lineno, why = bad_decisions[-1]
        earlier = "; an earlier round's decision is not used instead" if decisions else ""
        raise ValueError(
            f"{path} line {lineno}: its last decision row cannot be read ({why}){earlier}"
        )
    if not decisions:
        raise ValueError(
            f"{path} has no autotune decision: the job ended before a round of tuning did "
            f"({len(rows)} windows logged)"
        )
    return decisions[-1]
