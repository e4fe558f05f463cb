"""Activities (issue 23): the operator's table, what a submission through each door gets from
it, unknown activities listed, and the turn-taking plugin's split of a group's share."""
import pytest
from django.contrib.auth.models import Group

from carousel.domain import activities
from carousel.domain.services import restore_submit
from carousel.models import Activity, Bulk, RestoreRequest, UnknownActivity
from policies.turns import Lane, lane_weights


@pytest.fixture(autouse=True)
def _fresh_record_cache():
    activities._recorded.clear()
    yield
    activities._recorded.clear()


@pytest.fixture
def analysis(alice):
    return Group.objects.get(name="analysis")


# The table ------------------------------------------------------------------------------------

def test_a_groups_row_comes_before_every_groups_and_an_unknown_name_gets_the_groups_default(analysis, charlie):
    Activity.objects.create(group=None, name="Express", priority=1, weight=2)
    Activity.objects.create(group=analysis, name="Express", priority=2, weight=3)
    Activity.objects.create(group=analysis, name="default", priority=0, weight=0.5)
    rows = activities.table()
    production = Group.objects.get(name="production").id

    assert activities.setting(rows, analysis.id, "Express") == activities.Setting("Express", 2, 3.0, True)
    assert activities.setting(rows, production, "Express") == activities.Setting("Express", 1, 2.0, True)
    assert activities.setting(rows, analysis.id, "Nobody") == activities.Setting("default", 0, 0.5, False)
    assert activities.setting(rows, production, "") == activities.Setting("default", 0, 1.0, True)


# The native API -------------------------------------------------------------------------------

def test_the_native_api_takes_an_activity_and_the_requests_get_its_priority(as_alice, alice, analysis):
    Activity.objects.create(group=analysis, name="Express", priority=2, weight=3)

    r = as_alice.post("/api/v1/requests/", {"paths": ["/data/a", "/data/b"], "activity": "Express"}, format="json")

    assert r.status_code == 201, r.content
    assert sorted(RestoreRequest.objects.filter(user=alice).values_list("activity", "priority")) == [
        ("Express", 2), ("Express", 2)]
    listed = as_alice.get("/api/v1/requests/").json()["results"]
    assert {(x["activity"], x["priority"]) for x in listed} == {("Express", 2)}
    assert not UnknownActivity.objects.exists()


def test_an_explicit_higher_priority_is_kept_over_the_activitys(as_alice, alice, analysis):
    Activity.objects.create(group=analysis, name="Bulk", priority=0, weight=1)
    r = as_alice.post("/api/v1/requests/", {"paths": ["/data/a"], "activity": "Bulk", "priority": 3}, format="json")
    assert r.status_code == 201
    assert RestoreRequest.objects.get(user=alice).priority == 3


def test_an_unknown_activity_gets_the_groups_default_and_is_listed_once(as_alice, alice, analysis):
    Activity.objects.create(group=analysis, name="default", priority=1, weight=1)

    for i in range(3):
        r = as_alice.post("/api/v1/requests/", {"paths": [f"/data/u{i}"], "activity": "Mystery"}, format="json")
        assert r.status_code == 201

    assert set(RestoreRequest.objects.filter(user=alice).values_list("activity", "priority")) == {("default", 1)}
    assert set(Bulk.objects.filter(user=alice).values_list("activity", "resolved_activity")) == {
        ("Mystery", "default")}
    (unknown,) = UnknownActivity.objects.all()
    assert (unknown.group, unknown.name) == (analysis, "Mystery")


def test_no_activity_is_the_default_and_not_listed(as_alice, alice):
    assert as_alice.post("/api/v1/requests/", {"paths": ["/data/a"]}, format="json").status_code == 201
    assert RestoreRequest.objects.get(user=alice).activity == "default"
    assert not UnknownActivity.objects.exists()


@pytest.mark.parametrize("activity", ["x" * 129, ["Express"], "tab\there"])
def test_a_bad_activity_is_a_400(as_alice, alice, activity):
    r = as_alice.post("/api/v1/requests/", {"paths": ["/data/a"], "activity": activity}, format="json")
    assert r.status_code == 400, r.content
    assert not RestoreRequest.objects.exists()


def test_a_big_submission_through_the_intake_carries_its_activity(alice, analysis, now, settings):
    settings.CAROUSEL_INTAKE_ABOVE = 2
    Activity.objects.create(group=analysis, name="Express", priority=2, weight=3)
    result = restore_submit(user=alice, paths=[f"/data/big{i}" for i in range(5)], now=now, activity="Express")
    from carousel.domain import intake

    intake.settle(result.bulk.id)
    assert set(RestoreRequest.objects.filter(user=alice).values_list("activity", "priority")) == {("Express", 2)}


# The Tape REST door -----------------------------------------------------------------------------

def test_the_tape_rest_door_reads_the_activity_from_this_sites_metadata(as_alice, alice, analysis, settings):
    settings.CAROUSEL_TAPE_REST_SITENAME = "BNL-TAPE"
    Activity.objects.create(group=analysis, name="Express", priority=2, weight=3)
    body = {"files": [{"path": "/data/t0", "targetedMetadata": {"BNL-TAPE": {"activity": "Express"},
                                                                  "default": {"activity": "Staging"}}}]}
    r = as_alice.post("/api/tape-rest/v1/stage", body, format="json")
    assert r.status_code == 201, r.content
    assert RestoreRequest.objects.values_list("activity", "priority").get() == ("Express", 2)


# The admin --------------------------------------------------------------------------------------

def test_the_operator_edits_the_activity_table_in_the_admin(as_staff, analysis):
    assert as_staff.get("/admin/carousel/activity/").status_code == 200
    r = as_staff.post("/admin/carousel/activity/add/", {"group": analysis.id, "name": "Express", "priority": 2,
                                                         "weight": 3})
    assert r.status_code == 302, r.content
    assert Activity.objects.values_list("group", "name", "priority", "weight").get() == (analysis.id, "Express", 2, 3)
    twice = as_staff.post("/admin/carousel/activity/add/", {"group": analysis.id, "name": "Express", "priority": 1,
                                                             "weight": 1})
    assert twice.status_code == 200 and Activity.objects.count() == 1
    refused = as_staff.post("/admin/carousel/activity/add/", {"name": "Bad", "priority": 4, "weight": 0})
    assert refused.status_code == 200 and not Activity.objects.filter(name="Bad").exists()


def test_the_admin_lists_unknown_activities_and_adds_one_to_the_table(as_staff, alice, analysis, now):
    Activity.objects.create(group=analysis, name="default", priority=1, weight=0.5)
    restore_submit(user=alice, paths=["/data/a"], now=now, activity="Mystery")
    page = as_staff.get("/admin/carousel/unknownactivity/")
    assert page.status_code == 200 and b"Mystery" in page.content

    unknown = UnknownActivity.objects.get()
    r = as_staff.post("/admin/carousel/unknownactivity/", {"action": "add_to_table", "_selected_action": [unknown.id]})
    assert r.status_code == 302
    assert Activity.objects.values_list("name", "priority", "weight").get(name="Mystery") == ("Mystery", 1, 0.5)


# The turn-taking plugin's weights ------------------------------------------------------------------

def test_a_groups_share_goes_to_its_activities_by_weight_then_to_their_users():
    group_of = {1: "atlas", 2: "atlas", 3: "cms"}
    user_weights = {1: 0.25, 2: 0.25, 3: 0.5}  # GRPW, atlas and cms alike
    lanes = [Lane(1, "Express", 3), Lane(1, "Bulk", 1), Lane(2, "Bulk", 1), Lane(3, "default", 1)]

    weights = lane_weights(lanes, user_weights, group_of, {1, 2, 3})

    assert weights[(1, "Express")] == pytest.approx(0.375)
    assert weights[(1, "Bulk")] == pytest.approx(0.0625)
    assert weights[(2, "Bulk")] == pytest.approx(0.0625)
    assert weights[(3, "default")] == pytest.approx(0.5)


def test_one_activity_per_group_leaves_the_sharing_policys_weights_as_they_are():
    group_of = {1: "a", 2: "a", 3: None}
    user_weights = {1: 0.2, 2: 0.3, 3: 0.5}
    lanes = [Lane(1, "default"), Lane(2, "default"), Lane(3, "default")]
    assert lane_weights(lanes, user_weights, group_of, {1, 2, 3}) == pytest.approx(
        {(1, "default"): 0.2, (2, "default"): 0.3, (3, "default"): 0.5})


# The usage report ----------------------------------------------------------------------------------

def test_the_usage_report_breaks_figures_down_by_activity(alice, charlie, operator, analysis, now):
    from datetime import timedelta

    from carousel.loop.cycle import run_cycle
    from carousel.models import Control
    from tests.conftest import client_for
    from tests.test_loop import ScriptedStager

    t0 = (now - timedelta(days=1)).replace(hour=10, minute=0, second=0, microsecond=0)
    Activity.objects.create(group=None, name="Express", priority=1, weight=3)
    Control.objects.update_or_create(id=1, defaults={"files_per_job": 100})
    stager = ScriptedStager()
    stager.missing = {"/c/9"}
    restore_submit(user=alice, now=t0, paths=["/a/1", "/a/2", "/a/3"], activity="Express")
    restore_submit(user=charlie, now=t0, paths=["/c/1", "/c/9"])
    run_cycle(now=t0, stager=stager)
    run_cycle(now=t0 + timedelta(seconds=100), stager=stager)
    params = {"since": (t0 - timedelta(hours=1)).isoformat(), "until": (t0 + timedelta(hours=3)).isoformat(),
              "by": "activity"}

    report = client_for(operator).get("/api/v1/usage/", params).json()

    lines = {line["name"]: line for line in report["lines"]}
    assert set(lines) == {"Express", "default"}
    assert (lines["Express"]["requested_files"], lines["Express"]["restored_files"]) == (3, 3)
    assert (lines["default"]["requested_files"], lines["default"]["restored_files"]) == (2, 1)
    assert lines["default"]["failed"]["permanent"] == 1
    assert lines["Express"]["drive_s"] > 0 and lines["default"]["drive_s"] > 0
    assert lines["Express"]["drive_share"] + lines["default"]["drive_share"] == pytest.approx(1)
    own = client_for(alice).get("/api/v1/usage/", params).json()
    assert [line["name"] for line in own["lines"]] == ["Express"]
    csv_text = client_for(operator).get("/api/v1/usage/csv/", params).content.decode()
    assert "Express" in csv_text


# /metrics and the live page ---------------------------------------------------------------------------

def test_metrics_and_the_live_page_show_work_per_activity(alice, charlie, analysis, now, client):
    from carousel.loop.cycle import run_cycle
    from carousel.models import Control
    from tests.test_loop import ScriptedStager
    from tests.test_metrics import scrape, value

    Activity.objects.create(group=None, name="Express", priority=1, weight=3)
    Control.objects.update_or_create(id=1, defaults={"files_per_job": 100})
    stager = ScriptedStager()
    stager.answer = "staging"
    restore_submit(user=alice, now=now, paths=["/a/1", "/a/2", "/a/3"], activity="Express")
    restore_submit(user=charlie, now=now, paths=["/c/1"])
    run_cycle(now=now, stager=stager)
    assert RestoreRequest.objects.filter(state__in=["submitted", "staging"]).count() == 4

    samples, types = scrape(REMOTE_ADDR="127.0.0.1")

    assert types["carousel_activity_requests_in_flight"] == "gauge"
    assert value(samples, "carousel_activity_requests_in_flight", activity="Express") == 3
    assert value(samples, "carousel_activity_requests_in_flight", activity="default") == 1
    assert value(samples, "carousel_activity_drive_seconds_held", activity="Express") > 0

    client.force_login(alice)
    html = client.get("/live/fragment/").content.decode()
    assert "Work per activity" in html and "Express" in html


def test_an_unknown_activity_is_written_once_an_hour_not_per_submission(alice, now, django_capture_on_commit_callbacks):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with django_capture_on_commit_callbacks(execute=True):
        restore_submit(user=alice, paths=["/data/a"], now=now, activity="Mystery")
    with CaptureQueriesContext(connection) as queries, django_capture_on_commit_callbacks(execute=True):
        restore_submit(user=alice, paths=["/data/b"], now=now, activity="Mystery")

    assert not [q for q in queries.captured_queries if "carousel_unknownactivity" in q["sql"]]
    assert UnknownActivity.objects.get().name == "Mystery"


def test_the_tape_rest_door_refuses_an_activity_that_is_not_a_name(as_alice, alice):
    body = {"files": [{"path": "/data/t0", "targetedMetadata": {"default": {"activity": "bad\nname"}}}]}
    r = as_alice.post("/api/tape-rest/v1/stage", body, format="json")
    assert r.status_code == 400 and "activity" in r.json()["detail"], r.content
    assert not RestoreRequest.objects.exists()
