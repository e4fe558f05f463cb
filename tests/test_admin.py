import pytest

from carousel.models import Control, RestoreRequest
from carousel.domain.services import restore_submit


@pytest.mark.parametrize("url", [
    "/admin/", "/admin/carousel/restorerequest/", "/admin/carousel/control/", "/admin/carousel/tape/",
    "/admin/carousel/transition/", "/admin/carousel/job/", "/admin/carousel/bulk/", "/admin/auth/user/",
    "/admin/auth/group/", "/admin/carousel/filelocation/",
])
def test_operator_pages_load(as_staff, alice, now, url):
    restore_submit(user=alice, now=now, paths=["/a"])
    Control.get()
    assert as_staff.get(url).status_code == 200


@pytest.mark.parametrize("url, param", [("/admin/carousel/restorerequest/", "state"),
                                        ("/admin/carousel/bulk/", "label"), ("/admin/auth/user/", "username"),
                                        ("/admin/axes/accessattempt/", "username"), ("/requests/", "path")])
def test_a_nul_in_a_filter_is_a_400_not_a_database_error(as_staff, alice, now, url, param):
    """The admin filters a list by any column named in the query: a NUL reached PostgreSQL (issue 25)."""
    restore_submit(user=alice, now=now, paths=["/a"])
    answer = as_staff.get(url, {param: "queued\x00"})
    assert answer.status_code == 400
    assert f"the query parameter '{param}' contains a NUL byte" in answer.content.decode()


@pytest.mark.parametrize("url, action", [("/admin/carousel/restorerequest/", "retry_now"),
                                         ("/admin/carousel/restorerequest/", "delete_selected"),
                                         ("/admin/carousel/bulk/", "delete_selected"),
                                         ("/admin/auth/user/", "delete_selected")])
@pytest.mark.parametrize("selected", ["abc", "a\x00"])
def test_an_action_on_a_forged_selection_changes_nothing_and_says_so(as_staff, alice, now, url, action, selected):
    """The posted ids reached the action's query: 'abc' or a NUL was a 500 (issue 25)."""
    restore_submit(user=alice, now=now, paths=["/a"])
    answer = as_staff.post(url, {"action": action, "_selected_action": [selected]}, follow=True)
    assert answer.status_code == 200
    assert "The selection names no object of this list" in answer.content.decode()
    assert RestoreRequest.objects.count() == 1


def test_requests_are_searchable_by_path_and_user(as_staff, alice, bob, now):
    restore_submit(user=alice, now=now, paths=["/needle/x"])
    restore_submit(user=bob, now=now, paths=["/hay/y"])
    page = as_staff.get("/admin/carousel/restorerequest/", {"q": "needle"}).content.decode()
    assert "/needle/x" in page and "/hay/y" not in page
    page = as_staff.get("/admin/carousel/restorerequest/", {"q": "bob"}).content.decode()
    assert "/hay/y" in page and "/needle/x" not in page


def test_admin_actions_cancel_and_retry_now(as_staff, alice, now):
    restore_submit(user=alice, now=now, paths=["/a", "/b"])
    a, b = RestoreRequest.objects.order_by("path")
    RestoreRequest.objects.filter(pk=b.pk).update(state="failed", finished_at=now, error_class="transient")
    url = "/admin/carousel/restorerequest/"
    as_staff.post(url, {"action": "cancel", "_selected_action": [a.pk]})
    as_staff.post(url, {"action": "retry_now", "_selected_action": [b.pk]})
    a.refresh_from_db()
    b.refresh_from_db()
    assert a.state == "cancelled" and "operator" in a.last_error
    assert b.state == "queued" and b.finished_at is None and b.error_class == ""


def test_retry_now_skips_a_file_the_user_already_asked_for_again(alice, now):
    from carousel.domain.services import request_retry_now

    restore_submit(user=alice, now=now, paths=["/a"])
    RestoreRequest.objects.update(state="failed", finished_at=now)
    restore_submit(user=alice, now=now, paths=["/a"])
    assert request_retry_now(queryset=RestoreRequest.objects.all(), now=now) == 0


def test_the_control_row_is_editable(as_staff):
    control = Control.get()
    page = as_staff.get(f"/admin/carousel/control/{control.pk}/change/")
    assert page.status_code == 200 and b"Files per job (N)" in page.content


def test_the_admin_shows_stager_health_the_limit_quarantined_tapes_and_the_retry_queue(as_staff, alice, now):
    from datetime import timedelta

    from carousel.loop.cycle import run_cycle
    from tests.test_backpressure import Backend, control

    control(jobs_in_flight=8, quarantine_failures=2, retry_cycle_s=900)
    restore_submit(user=alice, now=now, paths=["/q/1", "/q/2"])
    backend = Backend({"/q/1": ("TQ", 0), "/q/2": ("TQ", 10**9)})
    run_cycle(now=now, stager=backend)
    backend.file_state = {"/q/1": "failed:transient:medium error", "/q/2": "failed:transient:medium error"}
    run_cycle(now=now + timedelta(seconds=60), stager=backend)
    backend.down = True
    run_cycle(now=now + timedelta(seconds=120), stager=backend)

    health = as_staff.get("/admin/carousel/stagerhealth/").content.decode().lower()
    assert "down" in health and "connection refused" in health
    # All failed: halved from 8 to 4; then down: halved again, 4 remembered as the healthy limit.
    assert '<td class="field-jobs_limit">2</td>' in health
    assert '<td class="field-healthy_limit">4</td>' in health
    tapes = as_staff.get("/admin/carousel/tape/", {"quarantined": "yes"}).content.decode()
    assert "TQ" in tapes and "2 failures" in tapes
    retries = as_staff.get("/admin/carousel/retryqueue/").content.decode()
    assert "/q/1" in retries and "/q/2" in retries and "medium error" in retries


def test_the_api_reports_stager_health(as_alice, alice, now):
    from carousel.models import StagerHealth

    StagerHealth.objects.update_or_create(id=1, defaults={"state": "stalled", "reason": "no progress",
                                                          "jobs_limit": 3, "healthy_limit": 12})
    body = as_alice.get("/api/v1/stager/").json()
    assert body["state"] == "stalled" and body["reason"] == "no progress"
    assert (body["jobs_limit"], body["healthy_limit"]) == (3, 12)
    assert body["retry_queue"] == 0 and body["quarantined_tapes"] == []


def test_a_groups_drive_allocation_is_set_in_the_admin(as_staff, charlie):
    """Reserved and most drives are edited with the group's share; a most below the reserved
    drives is refused with a message, and nothing is saved."""
    from django.contrib.auth.models import Group

    from carousel.models import GroupShare

    group = Group.objects.get(name="production")
    share = GroupShare.objects.get(group=group)
    url = f"/admin/auth/group/{group.id}/change/"
    assert b"Reserved drives" in as_staff.get(url).content

    def post(reserved, most):
        return as_staff.post(url, {
            "name": "production",
            "share-TOTAL_FORMS": "1", "share-INITIAL_FORMS": "1", "share-MIN_NUM_FORMS": "0",
            "share-MAX_NUM_FORMS": "1", "share-0-id": str(share.id), "share-0-group": str(group.id),
            "share-0-weight": "2.0", "share-0-inflight_cap": "", "share-0-reserved_drives": str(reserved),
            "share-0-max_drives": str(most),
            "path_prefixes-TOTAL_FORMS": "0", "path_prefixes-INITIAL_FORMS": "0",
            "path_prefixes-MIN_NUM_FORMS": "0", "path_prefixes-MAX_NUM_FORMS": "1000"})

    refused = post(3, 2)
    assert refused.status_code == 200 and b"The most drives cannot be below the reserved drives." in refused.content
    share.refresh_from_db()
    assert (share.reserved_drives, share.max_drives, share.weight) == (0, None, 1.0)
    assert post(1, 2).status_code == 302
    share.refresh_from_db()
    assert (share.reserved_drives, share.max_drives, share.weight) == (1, 2, 2.0)


# API tokens: a key is a password, shown only to those who may change the token ---------------

def _token_viewer(client, *, change=False):
    from django.contrib.auth.models import Permission

    from tests.conftest import make_user

    viewer = make_user("viewer", staff=True)
    codenames = ["view_tokenproxy"] + (["change_tokenproxy"] if change else [])
    viewer.user_permissions.add(*Permission.objects.filter(content_type__app_label="authtoken",
                                                           codename__in=codenames))
    client.force_login(viewer)
    return client


def test_a_view_only_operator_sees_api_keys_masked(client, alice):
    from rest_framework.authtoken.models import Token

    key = Token.objects.create(user=alice).key
    as_viewer = _token_viewer(client)
    for url in ("/admin/authtoken/tokenproxy/", f"/admin/authtoken/tokenproxy/{alice.pk}/change/",
                f"/admin/authtoken/tokenproxy/{alice.pk}/history/"):
        page = as_viewer.get(url)
        assert page.status_code == 200, url
        assert key not in page.content.decode(), url
        assert key[:4] + "•" in page.content.decode(), url
    assert Token.objects.get(user=alice).key == key


def test_one_who_may_change_a_token_sees_its_key(client, alice):
    from rest_framework.authtoken.models import Token

    key = Token.objects.create(user=alice).key
    as_changer = _token_viewer(client, change=True)
    for url in ("/admin/authtoken/tokenproxy/", f"/admin/authtoken/tokenproxy/{alice.pk}/change/"):
        assert key in as_changer.get(url).content.decode(), url


@pytest.mark.parametrize("field,value,says", [
    ("pin_lifetime", "99999999 00:00:00", "pin_lifetime must be a duration from"),
    ("pin_lifetime", "0", "pin_lifetime must be a duration from"),
    ("destination", "relative/dir", "destination:"),
    ("destination", "/anywhere/not/a/root", "destination:"),
    ("priority", "9", "priority must be an integer from 0 to 3"),
])
def test_a_requests_options_edited_in_the_admin_are_checked_as_a_submission_checks_them(as_staff, alice, now,
                                                                                    field, value, says):
    """The admin saved a pin of 99,999,999 days (every cycle then stopped on it), a relative
    destination (the request was reported delivered there) and a priority of 9 (a constraint's
    name for an error): each is refused as a submission refuses it, and nothing is stored."""
    restore_submit(user=alice, now=now, paths=["/adm/a"])
    req = RestoreRequest.objects.get()
    url = f"/admin/carousel/restorerequest/{req.pk}/change/"
    form = {"priority": "0", "deadline_0": "", "deadline_1": "", "pin_lifetime": "", "destination": ""}
    form[field] = value
    answer = as_staff.post(url, form)
    assert answer.status_code == 200 and says in answer.content.decode(), answer.content.decode()[-3000:]
    req.refresh_from_db()
    assert (req.priority, req.pin_lifetime, req.destination) == (0, None, "")
    form = {"priority": "2", "deadline_0": "", "deadline_1": "", "pin_lifetime": "1 00:00:00", "destination": ""}
    assert as_staff.post(url, form).status_code == 302
    req.refresh_from_db()
    assert (req.priority, req.pin_lifetime.days) == (2, 1)


@pytest.mark.parametrize("url", ["/admin/carousel/bulk/add/", "/admin/carousel/filelocation/add/"])
def test_the_loops_records_cannot_be_forged_in_the_admin(as_staff, url):
    """A submission of 1,000 files for bob, made in the admin, showed as finished in his list."""
    assert as_staff.get(url).status_code == 403
    assert as_staff.post(url, {"files": "1000"}).status_code == 403


def test_a_submission_is_shown_not_changed_and_the_tape_map_not_deleted(as_staff, alice, now):
    from carousel.models import Bulk, TapeMapEntry, path_key

    bulk = restore_submit(user=alice, now=now, paths=["/adm/b"]).bulk
    url = f"/admin/carousel/bulk/{bulk.pk}/change/"
    assert as_staff.get(url).status_code == 200  # shown
    as_staff.post(url, {"files": "1000", "user": alice.pk})
    assert Bulk.objects.get(pk=bulk.pk).files == 1
    entry = TapeMapEntry.objects.create(path="/m/a", path_key=path_key("/m/a"), tape="M1", ordinal=1, loaded_at=now)
    assert as_staff.get(f"/admin/carousel/tapemapentry/{entry.pk}/delete/").status_code == 403
    assert TapeMapEntry.objects.filter(pk=entry.pk).exists()


@pytest.mark.parametrize("given", ["", "null"])
def test_clearing_the_policy_parameters_means_none(as_staff, given):
    """A cleared policy_params was a NOT NULL error, a 500."""
    control = Control.get()
    Control.objects.filter(id=1).update(policy_params={"slider_age_weight": 2.0})
    url = f"/admin/carousel/control/{control.pk}/change/"
    page = as_staff.get(url)
    form = {name: value for name, value in _form_values(page.content.decode()).items()}
    form["policy_params"] = given
    answer = as_staff.post(url, form)
    assert answer.status_code == 302, answer.content.decode()[-2000:]
    assert Control.objects.get(id=1).policy_params == {}


@pytest.mark.parametrize("given", ['{"x": 1e999}', '{"y": NaN}', '{"z": [1, -Infinity]}'])
def test_policy_parameters_that_are_not_finite_are_a_form_error(as_staff, given):
    """Python's JSON reader takes NaN and infinities, which JSON (and the database's check of the
    column) has not: the save was a 500 (a probe's finding)."""
    control = Control.get()
    url = f"/admin/carousel/control/{control.pk}/change/"
    form = dict(_form_values(as_staff.get(url).content.decode()))
    form["policy_params"] = given
    answer = as_staff.post(url, form)
    assert answer.status_code == 200 and "finite numbers only" in answer.content.decode()
    assert Control.objects.get(id=1).policy_params == control.policy_params


def _form_values(html):
    """The change form's fields as the page fills them (inputs, checked boxes, selected options, text areas)."""
    import re

    values = {}
    for tag in re.findall(r"<input[^>]*>", html):
        name = re.search(r'name="([^"]+)"', tag)
        if not name or 'type="submit"' in tag:
            continue
        if 'type="checkbox"' in tag:
            if "checked" in tag:
                values[name[1]] = "on"
            continue
        value = re.search(r'value="([^"]*)"', tag)
        values[name[1]] = value[1] if value else ""
    for name, body in re.findall(r'<select name="([^"]+)"[^>]*>(.*?)</select>', html, re.S):
        chosen = re.search(r'<option value="([^"]*)"[^>]*selected', body)
        values[name] = chosen[1] if chosen else ""
    for name, body in re.findall(r'<textarea name="([^"]+)"[^>]*>(.*?)</textarea>', html, re.S):
        values[name] = body.strip()
    return values


def test_the_admin_refuses_values_the_loop_cannot_use(as_staff, now):
    """Stored before: an activity name with a control character (no client's name can match it),
    a group's most drives of 0 (read as 1), a tape technology no drive reads (its files then went
    out with no mount planned)."""
    from django.contrib.auth.models import Group

    from carousel.models import Activity, GroupShare, Tape

    page = as_staff.post("/admin/carousel/activity/add/", {"name": "ctl\x01char", "priority": "1", "weight": "1"})
    assert page.status_code == 200 and "Printable characters only" in page.content.decode()
    assert not Activity.objects.filter(name__startswith="ctl").exists()
    share = GroupShare.objects.create(group=Group.objects.create(name="g"))
    share.max_drives = 0
    with pytest.raises(Exception, match="At least 1"):
        share.full_clean()
    tape = Tape.objects.create(label="T1", media="LTO-8")
    page = as_staff.post(f"/admin/carousel/tape/{tape.pk}/change/", {"label": "T1", "media": "LTO-99",
                                                                      "recent_failures": "0"})
    assert page.status_code == 200 and "Select a valid choice" in page.content.decode()
    assert Tape.objects.get(pk=tape.pk).media == "LTO-8"
    # A tab in a label and negative bytes were stored (a probe's finding).
    for given, says in [({"label": "tab\tT"}, "printable characters"), ({"used_bytes": "-1"}, "cannot be negative")]:
        page = as_staff.post(f"/admin/carousel/tape/{tape.pk}/change/", {"label": "T1", "media": "LTO-8",
                                                                          "recent_failures": "0", **given})
        assert page.status_code == 200 and says in page.content.decode(), given
    assert (Tape.objects.get(pk=tape.pk).label, Tape.objects.get(pk=tape.pk).used_bytes) == ("T1", None)


def test_a_constraint_the_admin_meets_says_what_to_fix_not_its_name(db):
    """"Constraint "groupshare_weight_positive" is violated." and kin were what a person saw."""
    from django.contrib.auth.models import Group
    from django.core.exceptions import ValidationError

    from carousel.models import Activity, GroupShare

    Activity.objects.create(name="Express", priority=1, weight=1)
    for obj, says in [(Activity(name=" Express ", priority=1, weight=1), "An activity of that name for every group"),
                      (GroupShare(group=Group.objects.create(name="g"), weight=0), "The weight must be greater than 0"),
                      # 1e300 was taken; two such groups' weights add up to infinity (a probe).
                      (GroupShare(group=Group.objects.create(name="h"), weight=1e300), "and at most 1,000,000"),
                      (RestoreRequest(path="/a", priority=9), "priority")]:
        with pytest.raises(ValidationError) as caught:
            obj.full_clean()
        text = " ".join(caught.value.messages)
        assert says in text and "is violated" not in text, text


def test_restore_requests_are_cancelled_never_deleted_by_hand(as_staff, alice, now):
    """The superuser's "delete selected" removed a request in flight: its submission then showed
    as finished, the file neither restored nor cancelled (a probe's finding)."""
    from carousel.domain.services import restore_submit

    restore_submit(user=alice, paths=["/del/a", "/del/b"], now=now)
    request = RestoreRequest.objects.filter(user=alice).first()
    assert as_staff.get(f"/admin/carousel/restorerequest/{request.pk}/delete/").status_code == 403
    answer = as_staff.post("/admin/carousel/restorerequest/", {"action": "delete_selected",
                                                                "_selected_action": [request.pk], "post": "yes"})
    assert answer.status_code in (200, 302)
    assert RestoreRequest.objects.filter(user=alice).count() == 2
    assert "delete_selected" not in as_staff.get("/admin/carousel/restorerequest/").content.decode()


def test_a_path_prefix_with_a_nul_is_told_that_alone(as_staff):
    """"Null characters are not allowed.  empty path": the second error, of the field left unset,
    said the opposite of what was typed (a probe's finding)."""
    from django.contrib.auth.models import Group

    from carousel.models import PathPrefix

    group = Group.objects.create(name="g")
    page = as_staff.post("/admin/carousel/pathprefix/add/", {"group": group.pk, "purpose": "restore",
                                                             "prefix": "/a\x00b"})
    text = page.content.decode()
    assert page.status_code == 200 and "Null characters are not allowed" in text and "empty path" not in text
    assert not PathPrefix.objects.exists()
