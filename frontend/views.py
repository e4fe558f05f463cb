"""The pages. Views read a form, call a service or a selector, and render; nothing more."""
import copy
import uuid
from datetime import timezone as dt_timezone
from dataclasses import replace

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST
from django_htmx.http import HttpResponseStopPolling

from carousel.domain import policy
from carousel.domain import selectors
from carousel.domain.selectors import submissions as submission_selectors
from carousel.outlook import estimates
from carousel.outlook import submissions
from carousel.outlook.live import JOBS_SHOWN, live_figures
from carousel.domain import services
from carousel.domain.exceptions import CarouselError
from carousel.models import ACTIVE_STATES, RestoreRequest, path_key
from carousel.tasks import withdraw_on_commit

from . import charts
from .forms import RequestFilter, RestoreForm, parse_ids
from .templatetags.carousel_ui import size

PAGE_SIZE = 50
SUBMISSIONS_SHOWN = 10
ERRORS_SHOWN = 100
LIVE_POLL_S = 3


@login_required
def requests_page(request):
    form = RequestFilter(request.GET)
    form.is_valid()  # a bad value is dropped from the filter, not an error page
    data = form.cleaned_data
    rows, next_after = selectors.request_page(user=request.user, state=form.states(), path=data.get("path"),
                                              bulk=data.get("bulk"), after=data.get("after"), size=PAGE_SIZE)
    now = timezone.now()
    ctx = estimates.queue_context(user=request.user, now=now)
    outlooks = estimates.request_outlooks(rows, user=request.user, ctx=ctx)
    query = request.GET.copy()
    query.pop("after", None)
    # Opens on the user's submissions, newest first; with ?bulk=, on that one's summary.
    shown, focus, older = [], None, None
    if data.get("bulk"):
        focus = submission_selectors.own_bulk(request.user, data["bulk"])
        shown = [focus] if focus else []
    elif not (data.get("state") or data.get("path") or data.get("after")):
        before = _moment(request.GET.get("before", ""))
        shown, older = submission_selectors.newest_bulks(
            request.user, size=SUBMISSIONS_SHOWN,
            before=None if before is None else (before, _uuid(request.GET.get("before_id", ""))))
    summaries = submissions.submission_summaries(shown, user=request.user, now=now, ctx=ctx)
    cards = [_card(b, summaries[b.pk], now) for b in shown]
    query.pop("before", None)
    query.pop("before_id", None)
    return render(request, "frontend/requests.html", {
        "submissions": cards if not focus else [], "focus": cards[0] if focus else None,
        "older_submissions": _with(query, before=older[0].isoformat(), before_id=older[1]) if older else "",
        "form": form, "rows": [(r, outlooks[r.id]) for r in rows], "ctx": ctx, "filtered": bool(query),
        "next_query": _with(query, after=next_after) if next_after else "",
        "first_query": query.urlencode() if data.get("after") else None,
        "here": request.get_full_path(), "active_states": ACTIVE_STATES,
        # Another user's submission, none, or not an id: said, not shown as an empty submission
        # of yours (a bad value is otherwise dropped from the filter).
        "not_yours": (str(data["bulk"]) if data.get("bulk") and not focus
                      else request.GET.get("bulk", "")[:80] if "bulk" in form.errors else ""),
        "cancellable": any(r.state in ACTIVE_STATES for r in rows),
    })


def _uuid(raw):
    """A submission's id from a link (?before_id=); None for anything else (ignored, as a bad filter is)."""
    try:
        return uuid.UUID(raw[:40])
    except ValueError:
        return None


def _moment(raw):
    """An ISO date-time from a link (?before=), aware; None for anything else (ignored, as a bad filter is)."""
    try:
        moment = parse_datetime(raw[:40])
    except ValueError:
        return None
    if moment is not None and timezone.is_naive(moment):
        moment = timezone.make_aware(moment, dt_timezone.utc)
    try:
        # In UTC, as the database compares it: 0001-01-01T00:00+01:00 is before year 1 there
        # (the embedded SQLite default's adapter raised OverflowError: a 500).
        return moment.astimezone(dt_timezone.utc) if moment is not None else None
    except OverflowError:
        return None


STEP_LABELS = {"restored": "restored", "delivering": "being delivered", "being_read": "being read",
               "planned": "planned", "queued": "queued", "waiting_to_retry": "waiting to retry", "failed": "failed",
               "cancelled": "cancelled", "expired": "expired"}


def _card(bulk, summary, now):
    """What the page shows of one submission: its steps with their share of the bar, the
    estimate for the rest (or when it finished), its size, its downloads."""
    files = max(summary.files, 1)
    steps = [{"step": step, "label": label, "files": summary.counts[step],
              "percent": f"{100 * summary.counts[step] / files:.2f}"}
             for step, label in STEP_LABELS.items() if summary.counts[step]]
    if summary.finished:
        when = (f"finished: the first file back at {submissions.clock(summary.estimate[0], now)}, the last at "
                f"{submissions.clock(summary.estimate[1], now)} UTC") if summary.estimate else "finished"
    elif summary.estimate:
        when = f"the rest {submissions.range_text(summary.estimate, now)}"
    elif summary.figures.not_located == sum(g.files for g in summary.figures.active):
        when = "no estimate yet: none of its files is located yet"
    else:
        when = "no estimate yet"
    downloads = {f"{what}_{fmt}": reverse(f"api:bulk-{what}-{fmt}", args=[bulk.pk])
                 for what, fmt in (("restored", "txt"), ("restored", "csv"), ("failed", "txt"), ("failed", "csv"))}
    return {"bulk": bulk, "summary": summary, "steps": steps, "when": when, "downloads": downloads,
            "bar_label": ", ".join(f"{s['files']:,} {s['label']}" for s in steps) or "no files",
            "files_url": f"{reverse('frontend:requests')}?bulk={bulk.pk}"}


def _with(query, **params):
    query = query.copy()
    for key, value in params.items():
        query[key] = value
    return query.urlencode()


@login_required
@require_POST
def cancel(request):
    try:
        ids = parse_ids(request.POST.getlist("cancel_one") or request.POST.getlist("ids"))
    except ValueError as exc:
        return HttpResponseBadRequest(f"Nothing cancelled: {exc}.", content_type="text/plain; charset=utf-8")
    if ids:
        chosen = policy.actionable_requests(policy.identity(request), policy.CANCEL).filter(pk__in=ids)
        count, pairs = services.request_cancel(queryset=chosen, now=timezone.now(), by=request.user)
        withdraw_on_commit(pairs)
        # Those not the caller's to cancel, or gone, are skipped as the API skips them: the
        # message said they "had already finished" when they were queued and someone else's.
        skipped = len(set(ids)) - count
        messages.success(request, f"{count} request(s) cancelled." + (
            f" {skipped} skipped: already finished, or not yours to cancel." if skipped else "")
            if count else "Nothing cancelled: the selected requests had already finished, or are not yours to cancel.")
    else:
        messages.warning(request, "Select the requests to cancel first.")
    back = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}):
        back = reverse("frontend:requests")
    return redirect(back)


@login_required
def restore(request):
    form = RestoreForm(request.POST or None, request.FILES or None, has_email=bool(request.user.email))
    context = {"form": form}
    if request.method != "POST" or not form.is_valid():
        return render(request, "frontend/restore.html", context, status=400 if form.errors else 200)
    paths, lines, errors = form.read_paths()
    if errors:
        context.update(detail=f"{len(errors)} line(s) are not UTF-8 text; nothing was stored.",
                       errors=errors[:ERRORS_SHOWN], hidden=len(errors) - ERRORS_SHOWN)
        return render(request, "frontend/restore.html", context, status=400)
    try:
        result = services.restore_submit(user=request.user, now=timezone.now(), paths=paths, **form.options())
    except CarouselError as exc:
        # Line numbers of the text as the user gave it, blank lines included.
        shown = [{**e, "line": lines[e["index"]]} for e in exc.errors[:ERRORS_SHOWN]]
        context.update(detail=exc.detail, errors=shown, hidden=len(exc.errors) - len(shown))
        return render(request, "frontend/restore.html", context, status=exc.status)
    parts = [f"{result.created} new request(s) queued"]
    if result.existing:
        parts.append(f"{result.existing} already active (yours, kept as they are)")
    if result.shared:
        parts.append(f"{result.shared} joined a restore already under way for another user")
    messages.success(request, f"Submitted {result.files} file(s): {'; '.join(parts)}.")
    return redirect(f"{reverse('frontend:requests')}?bulk={result.bulk.id}")


def _for_viewer(figures, user):
    """What a user may see of the live page. Operators (the view permission on restore
    requests, as in the API) see it all. Everyone else sees the aggregates (policies, the
    stager's health, counts per group, jobs per tape, the plots) and, of what names people or
    files, only their own: their own row of the per-user table, and the file a drive reads only
    when it is one of theirs. Other users' names and paths are not shown."""
    if policy.may_see_all(user):
        return figures, True
    users = [u for u in figures.users if u["username"] == user.get_username()]
    drives = figures.stager.get("drives") or []
    files = {d["file"] for d in drives if d.get("file")}
    mine = set()
    if files:
        keys = {path_key(f): f for f in files}
        mine = {keys[k] for k in RestoreRequest.objects.filter(user=user, path_key__in=list(keys),
                                                                state__in=ACTIVE_STATES)
                .values_list("path_key", flat=True)}
    shown = [d if d.get("file") in mine else {**d, "file": "", "hidden_file": bool(d.get("file"))} for d in drives]
    stager = {**figures.stager, "drives": shown}
    control = figures.control
    if control.last_cycle_error:  # an exception's text can name any user's path
        control = copy.copy(control)
        control.last_cycle_error = policy.HIDDEN_ERROR
    return replace(figures, users=users, stager=stager, control=control), False


def _live_context(user):
    figures, operator = _for_viewer(live_figures(now=timezone.now()), user)
    hours = [row["hour"].strftime("%H:00") for row in figures.series]

    def series(key):
        return [row[key] for row in figures.series]

    return {
        "f": figures, "operator": operator, "poll_s": LIVE_POLL_S, "jobs_shown": JOBS_SHOWN,
        "charts": [charts.bar_chart("Files restored per hour", hours, series("files")),
                   charts.bar_chart("Bytes restored per hour", hours, series("bytes"), fmt=size),
                   charts.bar_chart("Mounts per hour", hours, series("mounts")),
                   charts.bar_chart("Errors per hour (failed or retried)", hours, series("errors"))],
    }


@login_required
def live(request):
    return render(request, "frontend/live.html", _live_context(request.user))


def live_fragment(request):
    if not request.user.is_authenticated:
        return HttpResponseStopPolling()  # the session ended: stop polling instead of swapping in a login page
    return render(request, "frontend/_live.html", _live_context(request.user))
