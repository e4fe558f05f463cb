from datetime import timedelta

from carousel.loop.cycle import run_cycle
from carousel.models import RestoreRequest, Transition

URL = "/api/v1/requests/"


def submit(client, paths, **extra):
    r = client.post(URL, {"paths": paths, **extra}, format="json")
    assert r.status_code == 201, r.content
    return r.json()


def test_the_same_user_asking_again_gets_the_existing_request(as_alice, alice):
    first = submit(as_alice, ["/a", "/b"])
    second = submit(as_alice, ["/b", "/c"])
    assert second["created"] == 1 and second["existing"] == 1
    assert RestoreRequest.objects.filter(user=alice).count() == 3
    # The second bulk lists the request it got back.
    b = RestoreRequest.objects.get(path="/b")
    # (The creating submission is on the request row; the later one lists it with an item.)
    assert {str(b.bulk_id)} | {str(i.bulk_id) for i in b.bulk_items.all()} == {first["bulk_id"], second["bulk_id"]}
    listed = as_alice.get(URL, {"bulk": second["bulk_id"]}).json()["results"]
    assert sorted(r["path"] for r in listed) == ["/b", "/c"]


def test_a_finished_file_can_be_asked_for_again(as_alice, alice, now):
    submit(as_alice, ["/a"])
    RestoreRequest.objects.update(state="cancelled", finished_at=now)
    assert submit(as_alice, ["/a"])["created"] == 1


def test_users_share_one_stage_and_finish_together(as_alice, as_bob, alice, bob, now):
    submit(as_alice, ["/shared/f1"])
    run_cycle(now=now)  # locates and sends alice's request
    a = RestoreRequest.objects.get(user=alice)
    assert a.state == "submitted"
    result = submit(as_bob, ["/shared/f1"])
    assert result["shared"] == 1
    b = RestoreRequest.objects.get(user=bob)
    assert b.state == "submitted" and b.job_id == a.job_id
    run_cycle(now=now + timedelta(seconds=10))  # the stage completes
    assert set(RestoreRequest.objects.values_list("state", flat=True)) == {"done"}


def test_queued_requests_of_two_users_go_out_in_one_stage(as_alice, as_bob, alice, bob, now):
    submit(as_alice, ["/shared/f2"])
    submit(as_bob, ["/shared/f2"])
    run_cycle(now=now)
    a, b = RestoreRequest.objects.get(user=alice), RestoreRequest.objects.get(user=bob)
    assert a.job_id == b.job_id and a.job.files == 1


def test_cancelling_one_users_request_never_cancels_anothers(as_alice, as_bob, alice, bob, now):
    submit(as_alice, ["/shared/f3"])
    submit(as_bob, ["/shared/f3"])
    run_cycle(now=now)
    a = RestoreRequest.objects.get(user=alice)
    assert as_alice.post(f"{URL}{a.id}/cancel/").json() == {"cancelled": 1}
    assert RestoreRequest.objects.get(user=bob).state == "submitted"
    run_cycle(now=now + timedelta(seconds=10))
    assert RestoreRequest.objects.get(user=bob).state == "done"
    assert RestoreRequest.objects.get(user=alice).state == "cancelled"


def test_a_user_sees_and_cancels_only_their_own(as_alice, as_bob, alice):
    submit(as_alice, ["/a"])
    mine = RestoreRequest.objects.get(user=alice)
    assert as_bob.get(URL).json()["results"] == []
    assert as_bob.get(f"{URL}{mine.id}/").status_code == 404
    assert as_bob.post(f"{URL}{mine.id}/cancel/").status_code == 404
    assert as_bob.post(f"{URL}cancel/", {"ids": [mine.id]}, format="json").json() == {"cancelled": 0}
    mine.refresh_from_db()
    assert mine.state == "queued"


def test_staff_see_everyones_requests(as_alice, as_bob, as_operator):
    submit(as_alice, ["/a"])
    submit(as_bob, ["/b"])
    assert len(as_operator.get(URL).json()["results"]) == 2


def test_it_filters_by_state_tape_and_time(as_alice, alice, now):
    submit(as_alice, ["/x/1", "/x/2", "/y/3"])
    run_cycle(now=now)
    req = RestoreRequest.objects.get(path="/x/1")
    assert req.tape is not None
    by_tape = as_alice.get(URL, {"tape": req.tape.label}).json()["results"]
    assert "/x/1" in [r["path"] for r in by_tape] and all(r["tape"] == req.tape.label for r in by_tape)
    assert len(as_alice.get(URL, {"state": "submitted,queued"}).json()["results"]) == 3
    assert as_alice.get(URL, {"state": "done"}).json()["results"] == []
    assert as_alice.get(URL, {"since": (now + timedelta(hours=1)).isoformat()}).json()["results"] == []
    bad = as_alice.get(URL, {"state": "finished"})
    assert bad.status_code == 400 and "unknown state(s) finished" in bad.json()["detail"]
    assert as_alice.get(URL, {"since": "yesterday"}).status_code == 400


def test_it_cancels_several_and_a_whole_bulk(as_alice, alice):
    submit(as_alice, ["/a", "/b", "/c"])
    ids = list(RestoreRequest.objects.filter(path__in=["/a", "/b"]).values_list("id", flat=True))
    assert as_alice.post(f"{URL}cancel/", {"ids": ids}, format="json").json() == {"cancelled": 2}
    bulk = submit(as_alice, ["/c", "/d"])
    # /c is also asked for by the first submission, which is not cancelled: it stays.
    assert as_alice.post(f"/api/v1/bulks/{bulk['bulk_id']}/cancel/").json() == {"cancelled": 1}
    assert dict(RestoreRequest.objects.values_list("path", "state")) == {
        "/a": "cancelled", "/b": "cancelled", "/c": "queued", "/d": "cancelled"}
    detail = as_alice.get(f"/api/v1/bulks/{bulk['bulk_id']}/").json()
    assert detail["states"]["cancelled"] == 1 and detail["states"]["queued"] == 1 and detail["files"] == 2


def test_cancel_records_history(as_alice, alice):
    submit(as_alice, ["/a"])
    req = RestoreRequest.objects.get()
    as_alice.post(f"{URL}{req.id}/cancel/")
    assert list(Transition.objects.values_list("from_state", "to_state")) == [("queued", "cancelled")]


def test_the_summary_counts_my_queue(as_alice, as_bob):
    submit(as_alice, ["/a", "/b"])
    submit(as_bob, ["/c"])
    summary = as_alice.get("/api/v1/summary/").json()
    assert summary["states"]["queued"] == 2 and summary["active"] == 2


def test_session_authentication_works_for_the_browser(client, alice):
    # Through the login form, as a browser does (authenticate() then sees the request, which
    # the login limit, django-axes, needs).
    assert client.post("/accounts/login/", {"username": "alice", "password": "alice-pw"}).status_code == 302
    assert client.get(URL).status_code == 200


def test_the_schema_and_its_ui_are_served(client, db):
    schema = client.get("/api/schema/")
    assert schema.status_code == 200 and b"/api/v1/requests/" in schema.content
    docs = client.get("/api/docs/")
    assert docs.status_code == 200 and b"swagger-ui" in docs.content
