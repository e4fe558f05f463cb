"""A submission as a person follows it: its files per step, when the rest are back, and why not
yet, summarised over its files ("18 files wait for tape SIM021, planned on drive 2 after the
current mount, about 14:05-14:20 UTC").

The figures are grouped counts (carousel/domain/selectors/submissions.py). The estimate is the
request model's (carousel/outlook/estimates.py), asked for a few files of each group: the first
and the last of the largest groups, and of each step the files that go first and last. This
module only combines those ranges (`combine_ranges`): the earliest any of the rest may be back,
the latest the last of them should be. One place to rewire when the model changes."""
from dataclasses import dataclass
from datetime import timedelta

from carousel.domain.selectors.submissions import SubmissionFigures, submission_figures
from carousel.infra import db
from carousel.models import RestoreRequest
from carousel.outlook import estimates

GROUPS_SHOWN = 5  # "why not yet" lines per submission; the rest are summed in one line


@dataclass(frozen=True)
class SubmissionSummary:
    figures: SubmissionFigures
    files: int
    finished: bool
    # (earliest, latest) datetimes: for the rest, when its first file may be back and when its
    # last should be (latest None: no upper bound known); once finished, the actual first and
    # last completion. None: no basis (nothing located, nothing restored).
    estimate: tuple | None
    why: tuple

    @property
    def counts(self):
        return self.figures.counts


def combine_ranges(spans, *, now):
    """(earliest, latest) datetimes from per-file ranges in seconds from now, (low, high or None):
    the soonest low and the latest high (None if any high is unknown); None without a range."""
    spans = [s for s in spans if s]
    if not spans:
        return None
    low = min(s[0] for s in spans)
    highs = [s[1] for s in spans]
    high = None if any(h is None for h in highs) else max(highs)
    return now + timedelta(seconds=low), (None if high is None else now + timedelta(seconds=high))


def _sample_ids(fig):
    """Request ids to ask the model about: the first and last file of the largest groups, and of
    each step the groups holding its first and its last file."""
    located = [g for g in fig.active if g.first_id is not None]
    chosen = located[:GROUPS_SHOWN]
    for step in {g.step for g in located}:
        of_step = [g for g in located if g.step == step]
        chosen += [min(of_step, key=lambda g: g.first_id), max(of_step, key=lambda g: g.last_id)]
    return {i for g in chosen for i in (g.first_id, g.last_id)}


def submission_summaries(bulks, *, user, now, ctx=None):
    """{bulk id: SubmissionSummary} for submissions of one user (`user`, whose queue the
    estimate reads); a few queries for the whole page of them."""
    bulks = list(bulks)
    with db.one_snapshot():  # the estimates agree with the counts (as the counts among themselves)
        return _summaries(bulks, user=user, now=now, ctx=ctx)


def _summaries(bulks, *, user, now, ctx):
    figures = submission_figures(bulks)
    wanted = set()
    for fig in figures.values():
        wanted |= _sample_ids(fig)
    outlooks = {}
    if wanted:
        ctx = ctx or estimates.queue_context(user=user, now=now)
        rows = list(RestoreRequest.objects.filter(id__in=wanted, user=user).select_related("tape"))
        outlooks = estimates.request_outlooks(rows, user=user, ctx=ctx)
    out = {}
    for bulk in bulks:
        fig = figures[bulk.pk]
        active = sum(g.files for g in fig.active)
        if not active:
            estimate = (fig.first_done_at, fig.last_done_at) if fig.first_done_at else None
            out[bulk.pk] = SubmissionSummary(figures=fig, files=bulk.files, finished=True, estimate=estimate, why=())
            continue
        spans = {i: outlooks[i].eta for i in _sample_ids(fig) if i in outlooks}
        estimate = combine_ranges(spans.values(), now=now)
        if estimate and fig.not_located:
            # A file not located yet has no basis: the rest may be back from the earliest on,
            # with no latest ("not before"), not by the located ones' latest.
            estimate = (estimate[0], None)
        out[bulk.pk] = SubmissionSummary(figures=fig, files=bulk.files, finished=False, estimate=estimate,
                                         why=_why(fig, outlooks, now))
    return out


def submission_summary(bulk, *, now):
    """The summary of one submission, estimated on its owner's queue."""
    return submission_summaries([bulk], user=bulk.user, now=now)[bulk.pk]


def _why(fig, outlooks, now):
    """Why not yet, for the submission: the reasons every waiting file shares (a pause, the
    stager down, a cap) once, then a line per group of files, the largest first."""
    located = [g for g in fig.active if g.first_id is not None and g.first_id in outlooks]
    queued = [outlooks[g.first_id].reasons for g in located if g.step == "queued"]
    shared = [r for r in queued[0] if all(r in q for q in queued[1:])] if len(queued) > 1 else []
    lines = list(shared)
    for g in fig.active[:GROUPS_SHOWN]:
        o = outlooks.get(g.first_id)
        own = [r for r in (o.reasons if o else ()) if r not in shared]
        span = None
        if o is not None:
            span = combine_ranges([o.eta, outlooks[g.last_id].eta if g.last_id in outlooks else None], now=now)
        lines.append(_group_line(g, own, span, now))
    rest = fig.active[GROUPS_SHOWN:]
    if rest:
        lines.append(f"{_files(sum(g.files for g in rest))} more wait in {len(rest)} other groups "
                     "(by tape and drive)")
    return tuple(lines)


def _files(n):
    return f"{n:,} file{'s' if n != 1 else ''}"


def clock(t, now):
    """A time as a person reads it next to now: "14:05", or "2026-11-29 14:05" another day (UTC)."""
    return f"{t:%H:%M}" if t.date() == now.date() else f"{t:%Y-%m-%d %H:%M}"


def range_text(span, now):
    """"about 14:05-14:20 UTC", "after 14:05 UTC", "" for no range."""
    if not span:
        return ""
    earliest, latest = span
    if latest is None:
        return f"not before {clock(earliest, now)} UTC"
    if clock(earliest, now) == clock(latest, now):
        return f"about {clock(latest, now)} UTC"
    return f"about {clock(earliest, now)}-{clock(latest, now)} UTC"


def _group_line(g, reasons, span, now):
    n, tape, drive = _files(g.files), g.tape, g.chain or "?"
    if g.step == "queued" and tape is None:
        return f"{n} not located yet: the broker asks the stager which tape holds them"
    wait = "wait" if g.files != 1 else "waits"
    if g.step == "queued":
        head = f"{n} {wait} in the queue for tape {tape}"
    elif g.step == "planned":
        head = f"{n} {wait} for tape {tape}, planned on drive {drive} after the mount before it there"
    elif g.step == "being_read":
        head = f"{n} {'are' if g.files != 1 else 'is'} at the stager for tape {tape}" + (
            f" on drive {g.chain}" if g.chain else "") + ", being read"
    elif g.step == "waiting_to_retry":
        head = f"{n} failed for now, tried again from {clock(g.retry_at, now)} UTC"
    else:  # delivering
        head = f"{n} restored, being delivered to their destination"
    detail = reasons[:2] if g.step == "queued" else []
    text = head + (f" ({'; '.join(detail)})" if detail else "")
    when = range_text(span, now)
    return f"{text}, {when}" if when else text

