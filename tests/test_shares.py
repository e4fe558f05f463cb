"""One share: a user's or group's part of the drives' time over a named period, the same figure
on my requests, the live page, the usage report (page and API) and the summary API
(carousel/outlook/shares.py)."""
import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from carousel.domain.services import restore_submit
from carousel.loop.locating import locate_requests
from carousel.models import Job, RestoreRequest, Tape
from carousel.ops import usage
from carousel.outlook import live, shares
from tests.conftest import client_for
from tests.site_plugins import MapStager


def web(user):
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def today(alice, charlie, operator):
    """Today so far: a finished mount of 3 of alice's files and 1 of charlie's, then a mount of
    charlie's on a drive now; each has a file still queued (so the live page lists them)."""
    now = timezone.now()
    floor = usage.day_floor(now)
    span = (now - floor).total_seconds()
    where = {"/a/1": ("T1", 0), "/a/2": ("T1", 10**9), "/a/3": ("T1", 2 * 10**9), "/c/1": ("T1", 3 * 10**9),
             "/c/2": ("T2", 0), "/a/q": ("T3", 0), "/c/q": ("T3", 10**9)}
    restore_submit(user=alice, now=floor, paths=["/a/1", "/a/2", "/a/3", "/a/q"])
    restore_submit(user=charlie, now=floor, paths=["/c/1", "/c/2", "/c/q"])
    locate_requests(now=floor, stager=MapStager(where), limit=100)
    first = Job.objects.create(created_at=floor, tape=Tape.objects.get(label="T1"), files=4)
    RestoreRequest.objects.filter(path__in=["/a/1", "/a/2", "/a/3", "/c/1"]).update(
        state="submitted", job=first, submitted_at=floor)
    Job.objects.filter(id=first.id).update(state="sent", sent_at=floor + timedelta(seconds=0.1 * span))
    RestoreRequest.objects.filter(job=first).update(state="done", finished_at=floor + timedelta(seconds=0.4 * span))
    Job.objects.filter(id=first.id).update(state="done", finished_at=floor + timedelta(seconds=0.4 * span))
    second = Job.objects.create(created_at=floor, tape=Tape.objects.get(label="T2"), files=1)
    RestoreRequest.objects.filter(path="/c/2").update(state="submitted", job=second, submitted_at=floor)
    Job.objects.filter(id=second.id).update(state="sent", sent_at=floor + timedelta(seconds=0.8 * span))
    return now


def test_the_share_is_drive_time_held_over_the_period(today, alice, charlie):
    got = shares.drive_time_shares(now=timezone.now())
    # Alice 3/4 of the first mount (0.3 of the day so far); charlie 1/4 of it and the mount on
    # a drive now (0.2 so far): 0.225 / 0.075 + 0.2.
    assert got.of_user(alice.id) == pytest.approx(0.225 / 0.5, rel=0.01)
    assert got.of_user(charlie.id) == pytest.approx(0.275 / 0.5, rel=0.01)
    assert got.period == f"today ({usage.day_floor(today):%Y-%m-%d} UTC, so far)"


def test_the_live_page_the_usage_report_and_the_api_give_the_same_share(today, alice, charlie, operator):
    day = f"{usage.day_floor(today):%Y-%m-%d}"
    period = f"today ({day} UTC, so far)"
    figures = live.live_figures(now=timezone.now())
    on_live = {u["username"]: u["share"] for u in figures.users}
    floor = usage.day_floor(today)
    report = usage.usage_report(since=floor, until=floor + timedelta(days=1), now=timezone.now())
    in_report = {line.name: line.drive_share for line in report.lines}
    api = client_for(operator).get("/api/v1/usage/", {"since": f"{day}T00:00:00Z", "until": timezone.now().isoformat()})
    assert api.status_code == 200
    in_api = {line["name"]: line["drive_share"] for line in api.json()["lines"]}
    assert api.json()["share_period"] == period and figures.share_period == period
    summary = client_for(alice).get("/api/v1/summary/").json()["drive_share"]
    assert summary["period"] == period
    for name in ("alice", "charlie"):
        assert on_live[name] == pytest.approx(in_report[name], rel=1e-3) == pytest.approx(in_api[name], rel=1e-3)
    assert summary["share"] == pytest.approx(in_report["alice"], rel=1e-3)
    groups = {g["group"]: g["share"] for g in figures.groups}
    by_group = {line.name: line.drive_share for line in usage.usage_report(
        since=floor, until=floor + timedelta(days=1), by="group", now=timezone.now()).lines}
    assert groups["analysis"] == pytest.approx(by_group["analysis"], rel=1e-3)
    # The pages show it the same way, with the period next to it.
    shown = f"{in_report['alice']:.0%}"
    live_html = web(operator).get("/live/").content.decode()
    usage_html = web(operator).get("/usage/", {"since": day, "until": day}).content.decode()
    mine_html = web(alice).get("/").content.decode()
    assert f"Share of drive time, {period}" in live_html and f"Share of drive time, {period}" in usage_html
    assert f"Your share of drive time, {period}" in mine_html
    assert re.search(rf'data-testid="user-share">{shown}<', live_html)
    assert re.search(rf'data-testid="usage-share">{shown}<', usage_html)
    assert re.search(rf'data-testid="my-share">{shown}<', mine_html)


def test_the_live_page_and_the_usage_report_give_each_activity_the_same_share(today, alice, operator):
    """Per activity too, one share: drive time over the period, the mount on a drive so far
    included, on the live page as in the usage report by activity (and its page)."""
    RestoreRequest.objects.filter(user=alice).update(activity="Express")
    figures = live.live_figures(now=timezone.now())
    on_live = {a["activity"]: a["drive_share"] for a in figures.activities}
    floor = usage.day_floor(today)
    report = usage.usage_report(since=floor, until=floor + timedelta(days=1), by="activity", now=timezone.now())
    in_report = {line.name: line.drive_share for line in report.lines}
    # Express: alice's 3/4 of the finished mount (0.225 of 0.5); default: charlie's 1/4 of it
    # and his mount on a drive now (0.275).
    assert on_live == pytest.approx(in_report, rel=1e-3)
    assert in_report == pytest.approx({"Express": 0.45, "default": 0.55}, rel=1e-2)
    live_html = web(operator).get("/live/").content.decode()
    assert re.search(r'data-testid="activity-share">45%<', live_html)
    assert re.search(r'data-testid="activity-share">55%<', live_html)


def test_a_users_own_report_by_activity_gives_their_part_of_each_mount_and_everyones_share(today, alice):
    """alice, who may see only her own usage: her Express line is her part of the mount she
    shared with charlie (3 of its 4 files), and its share is of everyone's drive time, the
    figure the operator's report and her line by user give (before: her files alone counted,
    the whole mount hers and her share 100%)."""
    from carousel.domain import policy

    assert not policy.may_see_all_usage(alice)
    RestoreRequest.objects.filter(user=alice).update(activity="Express")
    now, floor = timezone.now(), usage.day_floor(today)
    period = {"since": floor, "until": floor + timedelta(days=1), "now": now}
    everyone = {line.name: line for line in usage.usage_report(by="activity", **period).lines}
    own = {line.name: line for line in usage.usage_report(by="activity", viewer=alice, **period).lines}
    by_user = {line.name: line for line in usage.usage_report(by="user", viewer=alice, **period).lines}
    assert set(own) == {"Express"}
    assert own["Express"].drive_s == pytest.approx(everyone["Express"].drive_s)
    assert own["Express"].mounts == pytest.approx(everyone["Express"].mounts) == pytest.approx(0.75)
    assert own["Express"].drive_share == pytest.approx(everyone["Express"].drive_share)
    assert own["Express"].drive_share == pytest.approx(by_user["alice"].drive_share, rel=1e-3)


def test_one_users_share_read_alone_is_the_figure_of_every_users(today, alice, charlie, operator):
    """The summary every client polls reads the caller's share alone (drive_time_share_of): the
    same figure as every user's pass, for a user with finished mounts only (alice), one with a
    mount on a drive now too (charlie) and one with none (operator), in three statements whatever
    the number of users (the day's usage, the jobs on the drives, their files in flight), none
    of them grouped by user or group."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    now = timezone.now()
    everyone = shares.drive_time_shares(now=now)
    for user in (alice, charlie, operator):
        with CaptureQueriesContext(connection) as queries:
            alone = shares.drive_time_share_of(user.id, now=now)
        assert alone.of_user(user.id) == pytest.approx(everyone.of_user(user.id), abs=1e-9), user
        assert alone.total_s == pytest.approx(everyone.total_s) and alone.period == everyone.period
        assert len(queries.captured_queries) == 3, [q["sql"] for q in queries.captured_queries]
        grouped_by = [q["sql"].upper().partition("GROUP BY")[2] for q in queries.captured_queries]
        assert not [by for by in grouped_by if '"USER_ID"' in by or '"GROUP_' in by], grouped_by
    assert charlie.id in everyone.users and operator.id not in everyone.users
    with pytest.raises(ValueError):
        alone.of_group(None)
    summary = client_for(charlie).get("/api/v1/summary/").json()["drive_share"]
    assert summary["share"] == pytest.approx(everyone.of_user(charlie.id), rel=1e-3)
