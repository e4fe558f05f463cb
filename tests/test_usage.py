"""Usage reports against a hand count: a small history made by the real loop (the triggers
roll it up), then the report, the API, the CSV and the page."""
import csv
import io
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import Sum

from carousel.ops import usage
from carousel.loop.cycle import run_cycle
from carousel.models import WAIT_BUCKETS_S, Control, RestoreRequest
from carousel.ops.retention import prune
from carousel.domain.services import request_cancel, restore_submit
from tests.conftest import client_for
from tests.test_loop import ScriptedStager


@pytest.fixture
def history(alice, bob, charlie, now):
    """t0: alice 3 files and bob 2 on tape /a, charlie 4 on /c (one of them missing); bob cancels
    one. t0+100 s: restored (waits 100 s); alice asks for 2 more, restored at t0+4100 s."""
    # Yesterday 10:10 UTC: the whole history within one day.
    t0 = (now - timedelta(days=1)).replace(hour=10, minute=10, second=0, microsecond=0)
    Control.objects.update_or_create(id=1, defaults={"files_per_job": 100})
    stager = ScriptedStager()
    stager.missing = {"/c/4"}
    restore_submit(user=alice, now=t0, paths=["/a/1", "/a/2", "/a/3"])
    restore_submit(user=bob, now=t0, paths=["/a/b1", "/a/b2"])
    restore_submit(user=charlie, now=t0, paths=["/c/1", "/c/2", "/c/3", "/c/4"])
    request_cancel(queryset=RestoreRequest.objects.filter(path="/a/b2"), now=t0)
    run_cycle(now=t0, stager=stager)
    restore_submit(user=alice, now=t0 + timedelta(seconds=100), paths=["/a/4", "/a/5"])
    run_cycle(now=t0 + timedelta(seconds=100), stager=stager)
    run_cycle(now=t0 + timedelta(seconds=4100), stager=stager)
    assert RestoreRequest.objects.filter(state="done").count() == 9
    return t0


def _bytes(user, **filters):
    return RestoreRequest.objects.filter(user=user, **filters).aggregate(s=Sum("size"))["s"] or 0


def test_the_report_matches_a_hand_count(history, alice, bob, charlie):
    t0 = history
    report = usage.usage_report(since=t0 - timedelta(hours=1), until=t0 + timedelta(hours=3))
    lines = {line.name: line for line in report.lines}
    assert set(lines) == {"alice", "bob", "charlie"}
    a, b, c = lines["alice"], lines["bob"], lines["charlie"]
    assert (a.requested_files, a.restored_files, a.cancelled) == (5, 5, 0)
    assert (b.requested_files, b.restored_files, b.cancelled) == (2, 1, 1)
    assert (c.requested_files, c.restored_files) == (4, 3)
    assert c.failed == {"transient": 0, "permanent": 1, "user": 0, "delivery": 0, "other": 0}
    assert a.failed["permanent"] == b.failed["permanent"] == 0
    # Bytes: those the stager reported for the files (requested: every located file).
    assert a.restored_bytes == _bytes(alice, state="done") and a.requested_bytes == _bytes(alice)
    assert b.restored_bytes == _bytes(bob, state="done") and b.requested_bytes == _bytes(bob)
    assert c.restored_bytes == _bytes(charlie, state="done")
    # Waits: alice 100, 100, 100, 4000, 4000 s; the median's bucket is (60, 300], the 95th
    # percentile's (3600, 7200], capped by the longest wait, which is exact.
    assert a.wait_buckets[1] == 3 and a.wait_buckets[5] == 2 and sum(a.wait_buckets) == 5
    assert a.wait_p50_s == 300 and a.wait_p95_s == 4000 and a.wait_max_s == pytest.approx(4000)
    assert 100 <= a.wait_p50_s and WAIT_BUCKETS_S[4] < a.wait_p95_s <= WAIT_BUCKETS_S[5]
    assert b.wait_p50_s == 100 and b.wait_max_s == pytest.approx(100)  # one wait: the bucket capped by it
    # Mounts: job /a at t0 (alice 3 files, bob 1) and alice's own at t0+100; job /c charlie's.
    assert a.mounts == pytest.approx(0.75 + 1) and b.mounts == pytest.approx(0.25) and c.mounts == pytest.approx(1)
    # Drive time: job /a 100 s (75 / 25), alice's second 4,000 s, job /c 100 s.
    assert a.drive_s == pytest.approx(4075) and b.drive_s == pytest.approx(25) and c.drive_s == pytest.approx(100)
    assert a.drive_share == pytest.approx(4075 / 4200) and c.drive_share == pytest.approx(100 / 4200)
    # By group.
    groups = {line.name: line for line in usage.usage_report(since=t0 - timedelta(hours=1),
                                                              until=t0 + timedelta(hours=3), by="group").lines}
    assert groups["analysis"].restored_files == 6 and groups["production"].restored_files == 3
    assert groups["analysis"].mounts == pytest.approx(2) and groups["analysis"].wait_max_s == pytest.approx(4000)
    # Periods are whole UTC days: the day before has nothing, the day itself everything.
    assert usage.usage_report(since=t0 - timedelta(days=1), until=t0 - timedelta(hours=10, minutes=10)).lines == []
    day = usage.usage_report(since=t0 - timedelta(hours=10, minutes=10), until=t0 + timedelta(minutes=1))
    assert {line.name: line.restored_files for line in day.lines} == {"alice": 5, "bob": 1, "charlie": 3}


def test_the_report_outlives_pruning(history, now):
    t0 = history
    before = usage.usage_csv(usage.usage_report(since=t0 - timedelta(hours=1), until=t0 + timedelta(hours=3)))
    prune(now=now + timedelta(days=40))
    assert not RestoreRequest.objects.exists()
    after = usage.usage_csv(usage.usage_report(since=t0 - timedelta(hours=1), until=t0 + timedelta(hours=3)))
    assert after == before


def test_api_and_csv_staff_see_all_others_their_own(history, alice, operator):
    t0 = history
    params = {"since": (t0 - timedelta(hours=1)).isoformat(), "until": (t0 + timedelta(hours=3)).isoformat()}
    staff = client_for(operator).get("/api/v1/usage/", params).json()
    assert {line["name"] for line in staff["lines"]} == {"alice", "bob", "charlie"}
    assert staff["wait_buckets_s"] == list(WAIT_BUCKETS_S)
    own = client_for(alice).get("/api/v1/usage/", params).json()
    assert [line["name"] for line in own["lines"]] == ["alice"]
    assert own["lines"][0]["restored_files"] == 5 and own["lines"][0]["failed"]["permanent"] == 0
    mine_by_group = client_for(alice).get("/api/v1/usage/", {**params, "by": "group"}).json()
    assert [line["name"] for line in mine_by_group["lines"]] == ["analysis"]
    # The CSV has the same figures as the report.
    response = client_for(operator).get("/api/v1/usage/csv/", params)
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    by_name = {row["name"]: row for row in rows}
    assert list(rows[0]) == list(usage.CSV_COLUMNS)
    assert by_name["charlie"]["failed_permanent"] == "1" and by_name["bob"]["cancelled"] == "1"
    assert by_name["alice"]["restored_files"] == "5" and float(by_name["alice"]["wait_p95_s"]) == 4000
    assert float(by_name["alice"]["mounts"]) == 1.75 and float(by_name["bob"]["drive_s"]) == pytest.approx(25)


@pytest.mark.parametrize("params, where", [({"since": "yesterday"}, "since"), ({"by": "tape"}, "by"),
                                           ({"since": "2026-02-01T00:00Z", "until": "2026-01-01T00:00Z"}, "since")])
def test_bad_periods_are_a_clear_400(as_alice, params, where):
    response = as_alice.get("/api/v1/usage/", params)
    assert response.status_code == 400
    body = response.json()
    assert body["status"] == 400 and where in body["fields"]


@pytest.mark.parametrize("params, where", [({"until": "0001-01-03"}, "until"), ({"until": "9999-12-31T12:00Z"}, "until"),
                                           ({"since": "0001-01-01T00:00Z"}, "since"),
                                           ({"since": "1969-12-31T23:00Z"}, "since")])
def test_dates_beyond_the_reports_range_are_a_clear_400(as_alice, params, where):
    for url in ("/api/v1/usage/", "/api/v1/usage/csv/"):
        response = as_alice.get(url, params)
        assert response.status_code == 400, response.content
        assert "out of range" in str(response.json()["fields"][where])


@pytest.mark.parametrize("params", [{"until": "0001-01-03"}, {"until": "9999-12-31"}, {"since": "0001-01-01"},
                                    {"since": "1969-12-31", "until": "1970-01-02"}])
def test_the_page_refuses_dates_beyond_the_reports_range(client, alice, params):
    client.force_login(alice)
    page = client.get("/usage/", params)
    assert page.status_code == 400
    assert "out of range: between 1970-01-01 and 9999-01-01" in page.content.decode()


def test_the_page_and_its_csv(history, client, alice, operator):
    t0 = history
    day = t0.date().isoformat()
    client.force_login(operator)
    page = client.get("/usage/", {"since": day, "until": day})
    assert page.status_code == 200
    text = page.content.decode()
    assert "alice" in text and "charlie" in text and "≤ 300 s" in text
    exported = client.get("/usage/", {"since": day, "until": day, "format": "csv"})
    assert exported["Content-Type"].startswith("text/csv")
    assert {row["name"] for row in csv.DictReader(io.StringIO(exported.content.decode()))} == {
        "alice", "bob", "charlie"}
    client.force_login(alice)
    text = client.get("/usage/", {"since": day, "until": day}).content.decode()
    assert "alice" in text and "charlie" not in text
    assert client.get("/usage/", {"since": day, "until": "2000-01-01"}).status_code == 400


def test_the_pages_error_says_whose_requests_the_report_counts(client, operator, alice):
    """An operator's bad period said "Your own requests" on the 400 page."""
    client.force_login(operator)
    page = client.get("/usage/", {"since": "0001-01-01"})
    assert page.status_code == 400 and "Every user's" in page.content.decode()
    client.force_login(alice)
    assert "Your own" in client.get("/usage/", {"since": "0001-01-01"}).content.decode()


def test_the_page_gives_sizes_as_the_command_does(history, client, alice):
    """The pages counted bytes in 1,024s (Django's filesizeformat) under the names `carousel`
    uses for 1,000s: one file was 1.4 GB on a page and 1.5 GB in the command."""
    from carousel_client.cli import _size

    from frontend.templatetags.carousel_ui import size

    day = history.date().isoformat()
    client.force_login(alice)
    text = client.get("/usage/", {"since": day, "until": day}).content.decode()
    assert f"{_size(_bytes(alice, state='done'))}<" in text
    for n in (0, 999, 1_000, 1_500_000_000, 2_000_000_000_000, 5 * 10**15, None):
        assert size(n) == ("" if n is None else _size(n))


def test_the_usage_trigger_counts_waits_in_the_models_buckets(db):
    """The trigger carries a frozen copy of WAIT_BUCKETS_S (its migration's): the one installed
    agrees with the model."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_functiondef('carousel_usage_update'::regproc)")
        (definition,) = cursor.fetchone()
    bounds = re.findall(r"WHEN n\.wait <= (\d+) THEN (\d+)", definition)
    assert [(int(bound), int(bucket)) for bound, bucket in bounds] == [
        (bound, bucket) for bucket, bound in enumerate(WAIT_BUCKETS_S)]
    assert f"ELSE {len(WAIT_BUCKETS_S)} END" in definition


def test_the_api_and_the_page_report_the_same_seven_days_by_default(alice, as_alice, client):
    """The API's default (7 days before now, widened to whole days) covered 8 days, the page's
    7: the same user's share and counts differed between the two doors (a probe's finding)."""
    from django.utils.dateparse import parse_datetime

    api = as_alice.get("/api/v1/usage/").json()
    client.force_login(alice)
    report = client.get("/usage/").context["report"]
    assert (parse_datetime(api["since"]), parse_datetime(api["until"])) == (report.since, report.until)
    assert (report.until - report.since).days == 7
    assert api["share_period"] == client.get("/usage/").context["share_period"]
