"""Prometheus metrics at /metrics (docs/operations.md lists them).

Every value is read from the database at scrape time, from rows the database keeps (the
trigger-kept StateCount and CounterTotal of migrations/0002_triggers.py, the loop's control and health rows,
the cycle histogram the loop writes below), never from a process's memory: any gunicorn worker
answers the same, Celery's processes need no exporter of their own, and a counter never goes
down when old requests are pruned. Each read is a few rows or an index probe, so a scrape costs
the same at 1,000 or 1,000,000 queued requests (benchmarks/metrics_scrape.py)."""
import ipaddress
import math
import secrets

from django.contrib.auth.models import Group
from django.db import connection
from django.db.models import Case, F, When
from django.http import HttpResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_safe
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from carousel.domain.selectors.activities import activity_figures
from carousel.infra.db import read_moment
from carousel.models import (ACTIVE_STATES, Control, CounterTotal, CycleBucket, ErrorClass, HealthState, Job, JobState,
                     StagerHealth, StateCount, Tape)

CYCLE_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, math.inf)
FAILURE_CLASSES = (ErrorClass.TRANSIENT, ErrorClass.PERMANENT, ErrorClass.USER, ErrorClass.DELIVERY, "other")
# CounterTotal name -> (metric name without _total, help)
COUNTERS = {
    "requests": ("carousel_requests_submitted", "Restore requests created."),
    "requested_bytes": ("carousel_requested_bytes", "Bytes of the requested files, counted once their size is known."),
    "files_restored": ("carousel_files_restored", "Requests restored (done)."),
    "bytes_restored": ("carousel_bytes_restored", "Bytes of the restored requests."),
    "retries": ("carousel_request_retries", "Transient failures sent to the retry queue."),
    "cancelled": ("carousel_requests_cancelled", "Requests cancelled."),
    "expired": ("carousel_requests_expired", "Requests expired at their deadline."),
    "mounts": ("carousel_mounts", "Jobs (tape mounts) sent to the stager."),
    "drive_seconds": ("carousel_drive_seconds", "Seconds from a job's sending to its end, summed."),
}


def record_cycle(seconds):
    """Called by the loop at the end of each cycle: add its duration to the histogram. One
    statement: the buckets at or above it count it, and +Inf (always among them) adds its
    seconds to the sum; it changes no row only before the buckets exist, made on first use."""
    for _ in range(2):
        if CycleBucket.objects.filter(le__gte=seconds).update(
                count=F("count") + 1, sum_s=Case(When(le=math.inf, then=F("sum_s") + seconds), default=F("sum_s"))):
            return
        CycleBucket.objects.bulk_create([CycleBucket(le=le) for le in CYCLE_BUCKETS_S], ignore_conflicts=True)


OLDEST_QUEUED = """
SELECT min(m) FROM (
    SELECT (SELECT r.created_at FROM carousel_restorerequest r
            WHERE r.user_id = b.user_id AND r.state = 'queued' AND r.tape_id IS NOT NULL
            ORDER BY r.created_at LIMIT 1) AS m
    FROM carousel_userbacklog b WHERE b.files > 0
    UNION ALL
    SELECT (SELECT created_at FROM carousel_restorerequest WHERE state = 'queued' AND tape_id IS NULL
            ORDER BY created_at LIMIT 1)
) AS x"""


def oldest_queued_at():
    """The oldest queued request's submission time: one index probe per user with located work
    (request_ready_user_age) and one for the unlocated (request_unlocated), not a scan."""
    with connection.cursor() as cursor:
        cursor.execute(OLDEST_QUEUED)
        value = cursor.fetchone()[0]
    return read_moment(value)  # SQLite returns min() over a subquery as text


class CarouselCollector:
    def collect(self):
        now = timezone.now()
        yield from self._requests()
        yield from self._counters()
        yield from self._cycle(now)
        yield from self._stager()
        oldest = oldest_queued_at()
        yield GaugeMetricFamily("carousel_oldest_queued_request_age_seconds",
                                "Age of the oldest queued request (0: none queued).",
                                value=max((now - oldest).total_seconds(), 0.0) if oldest else 0.0)
        yield GaugeMetricFamily("carousel_tapes_quarantined", "Tapes in quarantine.",
                                value=Tape.objects.filter(quarantined_at__isnull=False).count())
        yield from self._activities(now)

    def _activities(self, now):
        # Bounded by the work in flight and an hour's restores (not the queue): see activity_figures.
        rows = activity_figures(now=now)
        gauges = [("carousel_activity_requests_in_flight", "Requests planned or at the stager, by activity.",
                   "in_flight"),
                  ("carousel_activity_drive_seconds_held",
                   "Estimated drive seconds of the work planned or on the drives, by activity.", "drive_s"),
                  ("carousel_activity_restored_last_hour", "Requests restored in the last hour, by activity.",
                   "restored_last_hour")]
        for name, help_text, key in gauges:
            gauge = GaugeMetricFamily(name, help_text, labels=["activity"])
            for row in rows:
                gauge.add_metric([row["activity"]], row[key])
            yield gauge

    def _requests(self):
        rows = list(StateCount.objects.values_list("state", "group_key", "files", "bytes"))
        names = dict(Group.objects.filter(id__in={g for _, g, _, _ in rows}).values_list("id", "name"))
        by_state = GaugeMetricFamily("carousel_requests", "Active requests by state and group.",
                                     labels=["state", "group"])
        counts = {(state, "none"): 0 for state in ACTIVE_STATES}
        for state, group, files, _ in rows:
            key = (state, names.get(group, "none") if group else "none")
            counts[key] = counts.get(key, 0) + files
        for (state, group), files in sorted(counts.items()):
            by_state.add_metric([state, group], files)
        yield by_state
        yield GaugeMetricFamily("carousel_queued_bytes", "Bytes of the queued requests whose size is known.",
                                value=sum(b for s, _, _, b in rows if s == "queued"))
        yield GaugeMetricFamily("carousel_deliveries_pending", "Restored requests being delivered to their users.",
                                value=sum(f for s, _, f, _ in rows if s == "delivering"))

    def _counters(self):
        totals = {(n, label): v for n, label, v in CounterTotal.objects.values_list("name", "label", "value")}
        for key, (name, help_text) in COUNTERS.items():
            yield CounterMetricFamily(name, help_text, value=totals.get((key, ""), 0))
        failures = CounterMetricFamily("carousel_request_failures", "Requests failed for good, by error class.",
                                       labels=["class"])
        for cls in FAILURE_CLASSES:
            failures.add_metric([str(cls)], totals.get(("failures", str(cls)), 0))
        yield failures

    def _cycle(self, now):
        buckets = sorted(CycleBucket.objects.values_list("le", "count", "sum_s"))
        if not buckets:
            buckets = [(le, 0, 0.0) for le in CYCLE_BUCKETS_S]
        yield HistogramMetricFamily(
            "carousel_cycle_duration_seconds", "Duration of the loop's cycles (recorded by the worker).",
            buckets=[("+Inf" if math.isinf(le) else repr(le), count) for le, count, _ in buckets],
            sum_value=buckets[-1][2])
        control = Control.get()
        last = control.last_cycle_at
        yield GaugeMetricFamily("carousel_last_cycle_timestamp_seconds", "When the last cycle ran (Unix time).",
                                value=last.timestamp() if last else 0.0)
        yield GaugeMetricFamily("carousel_last_cycle_age_seconds", "Seconds since the last cycle (+Inf: never).",
                                value=max((now - last).total_seconds(), 0.0) if last else math.inf)
        yield GaugeMetricFamily("carousel_submission_paused", "1 when an operator paused submission to the stager.",
                                value=1 if control.paused else 0)
        self._control = control

    def _stager(self):
        health = StagerHealth.get()
        state = GaugeMetricFamily("carousel_stager_health", "The loop's judgement of the stager (1: current state).",
                                  labels=["state"])
        for value in HealthState.values:
            state.add_metric([value], 1 if health.state == value else 0)
        yield state
        yield GaugeMetricFamily("carousel_jobs_in_flight_limit", "The adaptive limit of jobs in flight.",
                                value=health.jobs_limit if health.jobs_limit is not None
                                else self._control.jobs_in_flight)
        yield GaugeMetricFamily("carousel_jobs_in_flight", "Jobs committed or at the stager, not finished.",
                                value=Job.objects.filter(state__in=[JobState.PENDING, JobState.SENT]).count())
        if health.disk_total_bytes:
            yield GaugeMetricFamily("carousel_stager_disk_free_bytes", "Free bytes of the stager's disk buffer.",
                                    value=health.disk_free_bytes or 0)


REGISTRY = CollectorRegistry(auto_describe=False)
REGISTRY.register(CarouselCollector())


def allowed(request):
    """A scraper from CAROUSEL_METRICS_ALLOW's networks, or one with the bearer token."""
    from django.conf import settings

    token = settings.CAROUSEL_METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    if token and header.startswith("Bearer ") and secrets.compare_digest(header[7:].strip(), token):
        return True
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(address in ipaddress.ip_network(net, strict=False) for net in settings.CAROUSEL_METRICS_ALLOW)


# Read only: GET and HEAD (a scrape), anything else a 405, before CSRF's 403 for a POST without
# its token (nothing here takes a form).
@csrf_exempt
@require_safe
def metrics_view(request):
    if not allowed(request):
        return HttpResponse("metrics: not from an allowed network and no valid token (CAROUSEL_METRICS_ALLOW, "
                            "CAROUSEL_METRICS_TOKEN)\n", status=403, content_type="text/plain")
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
