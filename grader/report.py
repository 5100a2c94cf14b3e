"""OUT/report.html: one self-contained page an instructor reads after a class run.

It holds, from the gradebook and the saved results: each question's difficulty (mean, share at
full marks, zeros; the hardest first, with its distribution drawn), the rows that need a look
(every status but `ok`, every flag such as a copy or late work, with its evidence), the totals
histogram of each lab, the time each notebook took, and a per-student table. Plots are inline SVG;
the page loads nothing (its Content-Security-Policy forbids it), and every string a learner could
have chosen (names, statuses, flags) is HTML-escaped.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from .gradebook import Outcome, atomic_write, safe_name
from .lms import Gradebook, read_gradebook
from .untrusted import plain, read_bytes

_STYLE = """
body{font-family:sans-serif;max-width:72em;margin:1.5em auto;padding:0 1em;color:#222;line-height:1.35}
table{border-collapse:collapse;margin:.5em 0 1.5em}
td,th{border:1px solid #ccc;padding:.25em .55em;text-align:left;vertical-align:top;font-size:.92em}
th{background:#f0f0f0} td.n{text-align:right;font-variant-numeric:tabular-nums}
.bad{color:#a40000} .muted{color:#666} h2{margin-top:1.6em;border-bottom:1px solid #ddd}
"""


def _h(value: object, limit: int = 300) -> str:
    """A string for the page: entities a CSV cell carries undone, controls made plain, escaped."""
    return html.escape(plain(html.unescape(str(value)), limit), quote=True)


@dataclass
class ReportRow:
    student: str
    lab: str
    scores: dict[str, float]
    possible: float
    total: float
    status: str
    seconds: float | None = None
    flags: list[str] = field(default_factory=list)


def _cache_entry(out: Path, student: str, lab: str, secret: bytes | None) -> dict | None:
    """A signed result file of OUT/.cache, or None when absent or its signature fails."""
    if secret is None:
        return None
    try:
        data = json.loads(read_bytes(out / ".cache" / safe_name(student) / f"{lab}.json", 2**20))
        claimed = data.pop("signature")
        body = json.dumps(data, sort_keys=True).encode()
        if hmac.compare_digest(claimed, hmac.new(secret, body, hashlib.sha256).hexdigest()):
            return data
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        pass
    return None


def _as_graded(cell: str) -> str:
    """The student name a gradebook cell was made from (csv_cell escaped HTML and quoted formulas)."""
    s = html.unescape(cell)
    return s[1:] if s.startswith("'") and s[1:2] in ("=", "+", "-", "@") else s


def rows_from_gradebook(out: Path, book: Gradebook, secret: bytes | None) -> list[ReportRow]:
    """The gradebook's rows, with the run time and flags of each from its signed result file."""
    rows = []
    for r in book.rows:
        entry = _cache_entry(out, _as_graded(r.student), r.lab, secret) or {}
        flags = [str(f) for f in entry.get("flags", []) if isinstance(f, str)]
        seconds = entry.get("seconds")
        rows.append(
            ReportRow(
                r.student,
                r.lab,
                r.scores,
                book.lab_possible(r.lab),
                r.total,
                r.status,
                float(seconds) if isinstance(seconds, int | float) else None,
                flags + [n for n in r.notes if n not in flags],
            )
        )
    return rows


def rows_from_outcomes(outcomes: list[Outcome]) -> list[ReportRow]:
    return [
        ReportRow(
            o.student,
            o.lab,
            dict(o.scores),
            sum(o.possible.values()),
            o.total,
            o.status,
            o.seconds or None,
            list(o.flags),
        )
        for o in outcomes
    ]


# --- plots (inline SVG) ---------------------------------------------------------------------------


def _bars_svg(counts: list[int], labels: list[str], title: str, width: int = 460, height: int = 150) -> str:
    top = max(counts) if counts and max(counts) > 0 else 1
    n = max(1, len(counts))
    left, bottom, plot_h = 34, 26, height - 48
    bw = (width - left - 8) / n
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'aria-label="{html.escape(title)}">',
        f'<text x="{left}" y="13" font-size="12">{html.escape(title)}</text>',
        f'<line x1="{left}" y1="{height - bottom}" x2="{width - 6}" y2="{height - bottom}" stroke="#888"/>',
        f'<text x="4" y="{height - bottom - plot_h + 9}" font-size="10">{top}</text>',
    ]
    for i, c in enumerate(counts):
        h = plot_h * c / top
        x = left + i * bw
        parts.append(
            f'<rect x="{x + 1:.1f}" y="{height - bottom - h:.1f}" width="{max(bw - 2, 1):.1f}" '
            f'height="{h:.1f}" fill="#4477aa"><title>{html.escape(labels[i])}: {c}</title></rect>'
        )
    step = max(1, math.ceil(n / 8))
    for i in range(0, n, step):
        parts.append(
            f'<text x="{left + i * bw:.1f}" y="{height - 10}" font-size="10">{html.escape(labels[i])}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _split_svg(zero: int, partial: int, full: int, width: int = 160) -> str:
    """One bar: the share of rows at zero (red), partial (grey) and full marks (green)."""
    n = max(1, zero + partial + full)
    x = 0.0
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="14">']
    for count, colour, what in (
        (zero, "#cc3311", "zero"),
        (partial, "#bbbbbb", "partial"),
        (full, "#228833", "full"),
    ):
        w = width * count / n
        if w:
            parts.append(
                f'<rect x="{x:.1f}" y="1" width="{w:.1f}" height="12" fill="{colour}">'
                f"<title>{what}: {count}</title></rect>"
            )
        x += w
    parts.append("</svg>")
    return "".join(parts)


# --- sections -------------------------------------------------------------------------------------


def question_rows(book: Gradebook, rows: list[ReportRow]) -> list[dict]:
    """Per question: rows, mean, share at full marks, zeros; the hardest (lowest mean share) first."""
    stats = []
    for q in book.questions:
        lab = q.split(".", 1)[0]
        possible = book.possible[q]
        pts = [r.scores.get(q, 0.0) for r in rows if r.lab == lab and r.possible]
        if not pts:
            continue
        mean = sum(pts) / len(pts)
        stats.append(
            {
                "question": q,
                "possible": possible,
                "n": len(pts),
                "mean": mean,
                "full": sum(p >= possible - 1e-9 for p in pts),
                "zeros": sum(p == 0 for p in pts),
                "share": mean / possible if possible else 1.0,
            }
        )
    return sorted(stats, key=lambda s: (s["share"], s["question"]))


def _questions_html(stats: list[dict]) -> str:
    out = [
        "<table><tr><th>question</th><th>points</th><th>n</th><th>mean</th><th>at full marks</th>"
        "<th>zeros</th><th>zero / partial / full</th></tr>"
    ]
    for s in stats:
        partial = s["n"] - s["full"] - s["zeros"]
        out.append(
            f"<tr><td>{_h(s['question'])}</td><td class=n>{s['possible']:g}</td><td class=n>{s['n']}</td>"
            f"<td class=n>{s['mean']:.2f}</td><td class=n>{100 * s['full'] / s['n']:.0f}%</td>"
            f"<td class=n>{s['zeros']}</td><td>{_split_svg(s['zeros'], partial, s['full'])}</td></tr>"
        )
    out.append("</table>")
    return "\n".join(out)


def _look_html(rows: list[ReportRow]) -> str:
    look = [r for r in rows if r.status != "ok" or r.flags]
    if not look:
        return "<p>Every row ran to the end with status ok and no flag.</p>"
    out = ["<table><tr><th>student</th><th>lab</th><th>total</th><th>status</th><th>flags</th></tr>"]
    for r in sorted(look, key=lambda r: (r.status == "ok", r.student, r.lab)):
        flags = "<br>".join(_h(f, 600) for f in r.flags)
        cls = ' class="bad"' if r.status != "ok" else ""
        out.append(
            f"<tr><td>{_h(r.student, 100)}</td><td>{_h(r.lab, 10)}</td>"
            f"<td class=n>{r.total:g} / {r.possible:g}</td><td{cls}>{_h(r.status, 500)}</td><td>{flags}</td></tr>"
        )
    out.append("</table>")
    return "\n".join(out)


def _histograms_html(rows: list[ReportRow]) -> str:
    out = []
    for lab in sorted({r.lab for r in rows if r.possible}):
        mine = [r for r in rows if r.lab == lab]
        possible = max(r.possible for r in mine)
        bins = max(1, min(10, math.ceil(possible)))
        counts = [0] * bins
        for r in mine:
            counts[min(bins - 1, int(bins * r.total / possible))] += 1
        labels = [f"{possible * i / bins:.3g}" for i in range(bins)]
        out.append(
            _bars_svg(counts, labels, f"lab {lab}: totals of {len(mine)} submission(s), of {possible:g}")
        )
    return "\n".join(out) or "<p>No graded lab.</p>"


def _times_html(rows: list[ReportRow]) -> str:
    timed = sorted((r for r in rows if r.seconds), key=lambda r: -(r.seconds or 0))
    if not timed:
        return "<p class=muted>No run times: the saved results were not found or not signed.</p>"
    longest = timed[0].seconds or 1.0
    out = ["<table><tr><th>student</th><th>lab</th><th>seconds</th><th></th></tr>"]
    for r in timed:
        w = 200 * (r.seconds or 0) / longest
        bar = f'<svg xmlns="http://www.w3.org/2000/svg" width="202" height="12"><rect width="{w:.1f}" height="12" fill="#66ccee"/></svg>'
        out.append(
            f"<tr><td>{_h(r.student, 100)}</td><td>{_h(r.lab, 10)}</td><td class=n>{r.seconds:.1f}</td><td>{bar}</td></tr>"
        )
    out.append("</table>")
    return "\n".join(out)


def _students_html(rows: list[ReportRow]) -> str:
    labs = sorted({r.lab for r in rows if r.possible})
    by: dict[str, dict[str, ReportRow]] = {}
    for r in rows:
        by.setdefault(r.student, {})[r.lab] = r
    out = ["<table><tr><th>student</th>" + "".join(f"<th>lab {_h(l, 10)}</th>" for l in labs) + "</tr>"]
    for student, mine in sorted(by.items()):
        cells = []
        for l in labs:
            r = mine.get(l)
            if r is None:
                cells.append("<td class=muted>—</td>")
            else:
                mark = "" if r.status == "ok" else f' <span class="bad" title="{_h(r.status, 200)}">*</span>'
                cells.append(f"<td class=n>{r.total:g} / {r.possible:g}{mark}</td>")
        out.append(f"<tr><td>{_h(student, 100)}</td>{''.join(cells)}</tr>")
    out.append("</table><p class=muted>* the status is not ok: see the rows that need a look.</p>")
    return "\n".join(out)


def report_html(book: Gradebook, rows: list[ReportRow], title: str = "Class report") -> str:
    statuses: dict[str, int] = {}
    for r in rows:
        statuses[r.status.split(":", 1)[0]] = statuses.get(r.status.split(":", 1)[0], 0) + 1
    summary = ", ".join(f"{n} {_h(s, 60)}" for s, n in sorted(statuses.items(), key=lambda x: -x[1]))
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; img-src data:\">",
        f"<title>{_h(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{_h(title)}</h1>",
        f"<p>{len(rows)} row(s), {len({r.student for r in rows})} student(s), labs "
        f"{', '.join(_h(l, 10) for l in sorted({r.lab for r in rows}))}. Statuses: {summary}. "
        f"<span class=muted>Written {stamp}.</span></p>",
        "<h2>Questions, hardest first</h2>",
        _questions_html(question_rows(book, rows)),
        "<h2>Rows that need a look</h2>",
        _look_html(rows),
        "<h2>Totals</h2>",
        _histograms_html(rows),
        "<h2>Time per notebook</h2>",
        _times_html(rows),
        "<h2>Students</h2>",
        _students_html(rows),
        "</body></html>",
    ]
    return "\n".join(parts)


def write_report(out: Path, outcomes: list[Outcome] | None = None, secret: bytes | None = None) -> Path:
    """OUT/report.html from OUT/gradebook.csv; run times and flags come from `outcomes` when given
    (a class run just finished), else from OUT/.cache's result files signed with `secret`."""
    book = read_gradebook(out)
    if outcomes is not None:
        rows = rows_from_outcomes(outcomes)
        notes = {(r.student, r.lab): r.notes for r in book.rows}
        for row in rows:
            row.flags += [n for n in notes.get((row.student, row.lab), []) if n not in row.flags]
    else:
        rows = rows_from_gradebook(out, book, secret)
    path = out / "report.html"
    atomic_write(path, report_html(book, rows, f"Class report: {out.resolve().name}"))
    return path
