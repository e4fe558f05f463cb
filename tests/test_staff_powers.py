"""Staff powers follow Django permissions, not is_staff: a staff account without permissions
is an ordinary user in the API, view permission shows everyone's requests, and cancelling
someone else's needs the change permission, in the API, the pages and the admin's actions."""
import pytest
from django.contrib.auth.models import Permission

from carousel.models import Job, RestoreRequest, Tape
from carousel.domain.services import restore_submit
from tests.conftest import client_for, make_user


def grant(user, *codenames):
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="carousel", codename__in=codenames))
    return type(user).objects.get(pk=user.pk)  # a fresh object: permissions are cached per object


@pytest.fixture
def bobs(bob, now):
    restore_submit(user=bob, now=now, paths=["/bob/a", "/bob/b"])
    return list(RestoreRequest.objects.filter(user=bob).order_by("id"))


def test_a_staff_account_without_permissions_neither_reads_nor_cancels_others_requests(staffer, bobs):
    api = client_for(staffer)
    assert api.get(f"/api/v1/requests/{bobs[0].id}/").status_code == 404
    assert api.get("/api/v1/requests/").json()["results"] == []
    assert api.post("/api/v1/requests/cancel/", {"ids": [r.id for r in bobs]}, format="json").json() == {"cancelled": 0}
    assert api.post(f"/api/v1/requests/{bobs[0].id}/cancel/").status_code == 404
    bulk = bobs[0].bulk_id  # the submission that created it
    assert api.post(f"/api/v1/bulks/{bulk}/cancel/").status_code == 404
    assert set(RestoreRequest.objects.values_list("state", flat=True)) == {"queued"}


def test_view_permission_shows_everyones_requests_but_does_not_cancel_them(staffer, bobs):
    viewer = grant(staffer, "view_restorerequest", "view_bulk")
    api = client_for(viewer)
    assert api.get(f"/api/v1/requests/{bobs[0].id}/").json()["user"] == "bob"
    assert len(api.get("/api/v1/requests/").json()["results"]) == 2
    r = api.post(f"/api/v1/requests/{bobs[0].id}/cancel/")
    assert r.status_code == 403 and "change permission" in r.json()["detail"]
    assert api.post("/api/v1/requests/cancel/", {"ids": [r.id for r in bobs]}, format="json").json() == {"cancelled": 0}
    bulk = bobs[0].bulk_id  # the submission that created it
    assert api.get(f"/api/v1/bulks/{bulk}/").status_code == 200
    assert api.post(f"/api/v1/bulks/{bulk}/cancel/").status_code == 403
    assert set(RestoreRequest.objects.values_list("state", flat=True)) == {"queued"}


def test_change_permission_cancels_anyones_requests(staffer, bobs):
    api = client_for(grant(staffer, "view_restorerequest", "change_restorerequest", "view_bulk"))
    assert api.post(f"/api/v1/requests/{bobs[0].id}/cancel/").json() == {"cancelled": 1}
    assert api.post("/api/v1/requests/cancel/", {"ids": [bobs[1].id]}, format="json").json() == {"cancelled": 1}


def test_the_web_cancel_form_cancels_only_your_own_without_change_permission(client, staffer, bobs):
    client.force_login(grant(staffer, "view_restorerequest"))
    client.post("/requests/cancel/", {"ids": [str(r.id) for r in bobs]})
    assert set(RestoreRequest.objects.values_list("state", flat=True)) == {"queued"}


def admin_action(client, model, action, ids):
    return client.post(f"/admin/carousel/{model}/", {"action": action, "_selected_action": ids})


@pytest.mark.parametrize("model,action", [("restorerequest", "cancel"), ("restorerequest", "retry_now"),
                                          ("retryqueue", "retry_now")])
def test_admin_actions_on_requests_need_the_change_permission(client, staffer, bobs, now, model, action):
    RestoreRequest.objects.filter(pk=bobs[0].pk).update(state="retry", retry_at=now, error_class="transient")
    viewer = grant(staffer, "view_restorerequest", "view_retryqueue")
    client.force_login(viewer)
    page = client.get(f"/admin/carousel/{model}/")
    assert page.status_code == 200 and f'value="{action}"'.encode() not in page.content
    admin_action(client, model, action, [bobs[0].pk])
    assert RestoreRequest.objects.get(pk=bobs[0].pk).state == "retry"

    client.force_login(grant(staffer, "change_restorerequest"))
    assert f'value="{action}"'.encode() in client.get(f"/admin/carousel/{model}/").content
    admin_action(client, model, action, [bobs[0].pk])
    assert RestoreRequest.objects.get(pk=bobs[0].pk).state == ("cancelled" if action == "cancel" else "queued")


def test_lifting_a_quarantine_needs_the_change_permission_on_tapes(client, staffer, now):
    tape = Tape.objects.create(label="TQ1", quarantined_at=now, quarantine_reason="medium errors")
    client.force_login(grant(staffer, "view_tape"))
    admin_action(client, "tape", "lift_quarantine", [tape.pk])
    assert Tape.objects.get().quarantined_at is not None
    client.force_login(grant(staffer, "change_tape"))
    admin_action(client, "tape", "lift_quarantine", [tape.pk])
    assert Tape.objects.get().quarantined_at is None


def test_the_job_admin_is_read_only_even_for_a_superuser(client, db, now):
    boss = make_user("boss", staff=True)
    boss.is_superuser = True
    boss.save()
    tape = Tape.objects.create(label="TJ1")
    job = Job.objects.create(tape=tape, files=1, created_at=now)
    client.force_login(boss)
    page = client.get(f"/admin/carousel/job/{job.pk}/change/")
    assert page.status_code == 200 and b'name="_save"' not in page.content
    assert client.get("/admin/carousel/job/add/").status_code == 403
    client.post(f"/admin/carousel/job/{job.pk}/change/", {"files": 99, "state": "done"})
    assert Job.objects.get().files == 1
    assert client.post(f"/admin/carousel/job/{job.pk}/delete/", {"post": "yes"}).status_code == 403
    assert Job.objects.exists()
