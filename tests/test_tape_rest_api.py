"""The WLCG Tape REST API v1 as Carousel serves it: every call, both slash forms, every error."""
import uuid
from datetime import timedelta

import pytest
from django.core.cache import cache
from django.utils import timezone

from carousel.grid import door as grid
from carousel.models import (
    Account, Bulk, ErrorClass, FileLocation, Job, RequestState as S, RestoreRequest, Tape, path_key,
)
from tests.conftest import client_for
from tests.test_wlcg_tokens import bearer, issuer  # noqa: F401 (a fixture)

BASE = "/api/tape-rest/v1"
pytestmark = pytest.mark.django_db


def stage(client, paths, slash="/", **extra):
    files = [{"path": p, **extra} for p in paths]
    return client.post(f"{BASE}/stage{slash}", {"files": files}, format="json")


def poll(client, rid, slash=""):
    return client.get(f"{BASE}/stage/{rid}{slash}")


def assert_problem(response, status):
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/problem+json")
    body = response.json()
    assert body["status"] == status and body["title"]
    return body


@pytest.mark.parametrize("url", ["/.well-known/wlcg-tape-rest-api", "/.well-known/wlcg-tape-rest-api/"])
def test_discovery_names_the_site_and_the_v1_endpoint(client, url, settings):
    settings.CAROUSEL_SITE_URL = "https://tape.example.org/"
    settings.CAROUSEL_TAPE_REST_SITENAME = "BNL-TAPE"
    body = client.get(url).json()
    assert body["sitename"] == "BNL-TAPE" and body["description"]
    assert body["endpoints"] == [{"uri": "https://tape.example.org/api/tape-rest/v1", "version": "v1",
                                  "metadata": {}}]


@pytest.mark.parametrize("slash", ["/", ""])
def test_stage_answers_201_with_absolute_location_and_every_path_submitted(as_alice, alice, slash, settings):
    settings.CAROUSEL_SITE_URL = "https://tape.example.org"
    r = stage(as_alice, ["/d/a", "/d//b", "/d/a"], slash=slash)
    assert r.status_code == 201, r.content
    rid = r.json()["requestId"]
    uuid.UUID(rid)
    assert r["Location"] == f"https://tape.example.org{BASE}/stage/{rid}"
    body = poll(as_alice, rid, slash).json()
    assert body["id"] == rid and isinstance(body["createdAt"], int) and isinstance(body["startedAt"], int)
    assert "completedAt" not in body
    # duplicates collapse, paths are normalised, every path is there from the POST on
    assert sorted(f["path"] for f in body["files"]) == ["/d/a", "/d/b"]
    assert all(f == {"path": f["path"], "state": "SUBMITTED"} for f in body["files"])
    assert RestoreRequest.objects.filter(user=alice).count() == 2


def test_timestamps_are_seconds(as_alice):
    rid = stage(as_alice, ["/d/a"]).json()["requestId"]
    created = poll(as_alice, rid).json()["createdAt"]
    assert abs(created - timezone.now().timestamp()) < 60


def test_a_stage_requests_started_at_does_not_move(as_alice, alice, now):
    """The request's startedAt was its creation until a file went to the stager, then that
    file's moment (and again if that file was sent anew): a client that keeps the first value
    it saw and one that reads the last disagreed about one request."""
    rid = stage(as_alice, ["/d/a", "/d/b"]).json()["requestId"]
    before = poll(as_alice, rid).json()["startedAt"]
    RestoreRequest.objects.filter(path="/d/a").update(state=S.SUBMITTED, submitted_at=now + timedelta(hours=1),
                                                      job=_job(now))
    cache.clear()  # the poll's kept answer (CAROUSEL_TAPE_REST_POLL_CACHE_S): an update() does not drop it
    body = poll(as_alice, rid).json()
    assert body["startedAt"] == before == body["createdAt"]
    assert {f["path"]: f.get("startedAt") for f in body["files"]}["/d/a"] == int((now + timedelta(hours=1)).timestamp())


def test_n_files_mean_n_stages_of_one(as_alice, alice):
    first = stage(as_alice, ["/d/a"]).json()["requestId"]
    second = stage(as_alice, ["/d/a", "/d/b"]).json()["requestId"]
    # one restore request per file, shared by both stage requests: nothing stored twice
    assert RestoreRequest.objects.filter(user=alice).count() == 2
    a1 = poll(as_alice, first).json()["files"]
    a2 = {f["path"]: f for f in poll(as_alice, second).json()["files"]}
    assert a1[0] == a2["/d/a"]


def test_disk_lifetime_and_targeted_metadata_are_kept_unknown_fields_ignored(as_alice, settings):
    settings.CAROUSEL_TAPE_REST_SITENAME = "BNL-TAPE"
    files = [{"path": "/d/a", "diskLifetime": "PT2H", "targetQos": "disk",
              "targetedMetadata": {"default": {"activity": "Analysis Input"}, "BNL-TAPE": {"x": 1},
                                   "OTHER": {"y": 2}}},
             {"path": "/d/b", "diskLifetime": "PT1H"}]
    r = as_alice.post(f"{BASE}/stage/", {"files": files, "unknown": True}, format="json")
    assert r.status_code == 201, r.content
    bulk = Bulk.objects.get(pk=r.json()["requestId"])
    assert bulk.metadata == {"default": {"activity": "Analysis Input"}, "BNL-TAPE": {"x": 1}}
    assert bulk.activity == "Analysis Input"
    assert set(RestoreRequest.objects.values_list("pin_lifetime", flat=True)) == {timedelta(hours=2)}


@pytest.mark.parametrize("activities, where", [
    ([{"BNL-TAPE": {"activity": "Express"}}, {"BNL-TAPE": {"activity": "Bulk"}}],
     "files[1]: activity 'Bulk' differs from files[0]'s 'Express'"),
    ([{"default": {"activity": "Express"}}, {"default": {"activity": "Bulk"}, "BNL-TAPE": {"activity": "Express"}},
      {"default": {"activity": "Bulk"}}], "files[2]: activity 'Bulk' differs from files[0]'s 'Express'"),
    ([{"BNL-TAPE": {"activity": "x" * 129}}], "files[0].targetedMetadata.BNL-TAPE.activity: expected an activity"),
    ([{}, {"default": {"activity": 7}}], "files[1].targetedMetadata.default.activity: expected an activity"),
])
def test_activities_that_cannot_all_be_kept_are_refused_and_nothing_stored(as_alice, settings, activities, where):
    """The first file's activity was applied to every file, a name past 128 characters was cut
    and one that is not a string ignored, each without a word: now a 400 problem naming the file."""
    settings.CAROUSEL_TAPE_REST_SITENAME = "BNL-TAPE"
    files = [{"path": f"/d/{i}", "targetedMetadata": meta} for i, meta in enumerate(activities)]
    r = as_alice.post(f"{BASE}/stage", {"files": files}, format="json")
    assert r.status_code == 400 and r["Content-Type"] == "application/problem+json", r.content
    assert where in r.json()["detail"], r.json()
    assert not RestoreRequest.objects.exists() and not Bulk.objects.exists()


def test_targeted_metadata_past_what_is_kept_is_refused(as_alice, settings):
    """The metadata kept with a stage request had no bound: 20 MB of it were stored, from any user."""
    settings.CAROUSEL_TAPE_REST_SITENAME = "BNL-TAPE"
    big = {"BNL-TAPE": {"activity": "Express", "junk": "x" * 20_000}}
    r = as_alice.post(f"{BASE}/stage", {"files": [{"path": "/d/a", "targetedMetadata": big}]}, format="json")
    assert r.status_code == 400 and "files[0].targetedMetadata: what is kept" in r.json()["detail"]
    assert not Bulk.objects.exists()
    # Another site's key is not kept, whatever its size.
    other = {"OTHER": {"junk": "x" * 20_000}, "default": {"activity": "Express"}}
    assert as_alice.post(f"{BASE}/stage", {"files": [{"path": "/d/a", "targetedMetadata": other}]},
                         format="json").status_code == 201


def test_a_file_without_an_activity_takes_the_requests(as_alice, settings):
    settings.CAROUSEL_TAPE_REST_SITENAME = "BNL-TAPE"
    files = [{"path": "/d/a"}, {"path": "/d/b", "targetedMetadata": {"BNL-TAPE": {"activity": "Express"}}},
             {"path": "/d/c", "targetedMetadata": {"BNL-TAPE": {"activity": "Express"}}},
             {"path": "/d/d", "targetedMetadata": {"BNL-TAPE": {"activity": " "}}}]  # empty: none given
    assert as_alice.post(f"{BASE}/stage", {"files": files}, format="json").status_code == 201
    assert list(Bulk.objects.values_list("activity", flat=True)) == ["Express"]  # the name given, for every file


@pytest.mark.parametrize("body, where", [
    ("not json", "JSON parse error"),
    ([], "JSON object"),
    ({}, "files"),
    ({"files": []}, "files"),
    ({"files": [{"nopath": 1}]}, "files[0]"),
    ({"files": [{"path": "/a", "diskLifetime": "forever"}]}, "diskLifetime"),
    ({"files": [{"path": "relative"}]}, "absolute"),
    ({"files": [{"path": "/a", "targetedMetadata": []}]}, "targetedMetadata"),
])
def test_bad_stage_body_is_a_400_problem_and_nothing_stored(as_alice, body, where):
    if isinstance(body, str):
        r = as_alice.generic("POST", f"{BASE}/stage/", body, content_type="application/json")
    else:
        r = as_alice.post(f"{BASE}/stage/", body, format="json")
    problem = assert_problem(r, 400)
    assert where in problem["detail"]
    assert not Bulk.objects.exists() and not RestoreRequest.objects.exists()


def test_too_many_files_is_413(as_alice, settings):
    settings.CAROUSEL_TAPE_REST_MAX_FILES = 2
    assert_problem(stage(as_alice, ["/a", "/b", "/c"]), 413)
    assert not RestoreRequest.objects.exists()


def test_too_many_unfinished_requests_is_429(as_alice, settings):
    settings.CAROUSEL_TAPE_REST_MAX_UNFINISHED = 2
    assert stage(as_alice, ["/a"]).status_code == 201
    assert stage(as_alice, ["/b"]).status_code == 201
    assert_problem(stage(as_alice, ["/c"]), 429)
    assert not RestoreRequest.objects.filter(path="/c").exists()


def test_unauthenticated_is_401_problem(client):
    assert_problem(client.post(f"{BASE}/stage/", {"files": [{"path": "/a"}]}, content_type="application/json"), 401)


@pytest.mark.parametrize("rid", [str(uuid.uuid4()), "not-a-uuid"], ids=["a-uuid-nobody-made", "not-a-uuid"])
def test_unknown_id_is_404(as_alice, rid):
    assert_problem(poll(as_alice, rid), 404)
    assert_problem(as_alice.delete(f"{BASE}/stage/{rid}"), 404)
    assert_problem(as_alice.post(f"{BASE}/stage/{rid}/cancel", {"paths": ["/a"]}, format="json"), 404)


def test_another_users_request_is_404(as_alice, bob):
    rid = stage(as_alice, ["/d/a"]).json()["requestId"]
    assert poll(as_alice, rid.upper()).status_code == 200  # kept for later polls, with who may see it
    as_bob = client_for(bob)
    assert_problem(poll(as_bob, rid), 404)
    assert_problem(as_bob.post(f"{BASE}/stage/{rid}/cancel", {"paths": ["/d/a"]}, format="json"), 404)
    assert_problem(as_bob.delete(f"{BASE}/stage/{rid}"), 404)
    assert RestoreRequest.objects.get().state == S.QUEUED


@pytest.mark.parametrize("slash", ["", "/"])
def test_cancel_cancels_the_named_files_only(as_alice, slash):
    rid = stage(as_alice, ["/d/a", "/d/b"]).json()["requestId"]
    assert poll(as_alice, rid).status_code == 200  # a rendering kept for later polls ...
    r = as_alice.post(f"{BASE}/stage/{rid}/cancel{slash}", {"paths": ["/d//a"]}, format="json")
    assert r.status_code == 200, r.content
    states = {f["path"]: f for f in poll(as_alice, rid).json()["files"]}  # ... is dropped by the cancel
    assert states["/d/a"]["state"] == "CANCELLED" and "finishedAt" in states["/d/a"]
    assert states["/d/b"]["state"] == "SUBMITTED"


def test_cancel_with_a_foreign_path_is_400_and_cancels_nothing(as_alice):
    rid = stage(as_alice, ["/d/a", "/d/b"]).json()["requestId"]
    r = as_alice.post(f"{BASE}/stage/{rid}/cancel", {"paths": ["/d/a", "/elsewhere"]}, format="json")
    assert "/elsewhere" in assert_problem(r, 400)["detail"]
    assert set(RestoreRequest.objects.values_list("state", flat=True)) == {S.QUEUED}


def test_cancel_bad_body_is_400(as_alice):
    rid = stage(as_alice, ["/d/a"]).json()["requestId"]
    assert_problem(as_alice.post(f"{BASE}/stage/{rid}/cancel", {"paths": []}, format="json"), 400)
    assert_problem(as_alice.post(f"{BASE}/stage/{rid}/cancel", {"paths": "/d/a"}, format="json"), 400)


def test_cancel_of_a_finished_file_answers_200_and_changes_nothing(as_alice, now):
    rid = stage(as_alice, ["/d/a"]).json()["requestId"]
    RestoreRequest.objects.update(state=S.DONE, finished_at=now)
    r = as_alice.post(f"{BASE}/stage/{rid}/cancel", {"paths": ["/d/a"]}, format="json")
    assert r.status_code == 200
    assert RestoreRequest.objects.get().state == S.DONE


@pytest.mark.parametrize("slash", ["", "/"])
def test_delete_cancels_and_forgets_the_request(as_alice, slash):
    rid = stage(as_alice, ["/d/a"]).json()["requestId"]
    assert as_alice.delete(f"{BASE}/stage/{rid}{slash}").status_code == 200
    assert_problem(poll(as_alice, rid), 404)
    assert RestoreRequest.objects.get().state == S.CANCELLED


def _job(now):
    return Job.objects.create(created_at=now)


@pytest.mark.parametrize("state, tape_state", [
    (S.QUEUED, "SUBMITTED"), (S.SUBMITTED, "STARTED"), (S.STAGING, "STARTED"), (S.RETRY, "STARTED"),
    (S.DELIVERING, "STARTED"), (S.DONE, "COMPLETED"), (S.FAILED, "FAILED"), (S.CANCELLED, "CANCELLED"),
    (S.EXPIRED, "FAILED"),
])
def test_every_carousel_state_maps_to_a_tape_rest_state(as_alice, now, state, tape_state):
    rid = stage(as_alice, ["/d/a"]).json()["requestId"]
    fields = {"state": state}
    if state in (S.SUBMITTED, S.STAGING, S.RETRY, S.DELIVERING, S.DONE, S.FAILED, S.EXPIRED):
        fields.update(submitted_at=now - timedelta(seconds=30), job=_job(now), started_at=now)
    if state == S.RETRY:
        fields["retry_at"] = now
    if state in (S.DONE, S.FAILED, S.CANCELLED, S.EXPIRED):
        fields["finished_at"] = now
    if state == S.FAILED:
        fields.update(error_class=ErrorClass.PERMANENT, last_error="no such file")
    RestoreRequest.objects.update(**fields)
    body = poll(as_alice, rid).json()
    (f,) = body["files"]
    assert f["state"] == tape_state and "onDisk" not in f
    assert ("error" in f) == (tape_state == "FAILED")
    if state == S.FAILED:
        assert f["error"] == "no such file"
    if tape_state in ("COMPLETED", "FAILED", "CANCELLED"):
        assert f["finishedAt"] == int(now.timestamp()) and body["completedAt"] == int(now.timestamp())
    else:
        assert "finishedAt" not in f and "completedAt" not in body
    if tape_state == "STARTED":
        assert f["startedAt"] == int((now - timedelta(seconds=30)).timestamp())
    if tape_state == "SUBMITTED":
        assert "startedAt" not in f


def test_a_file_that_does_not_exist_fails_at_poll_time_not_at_post(as_alice):
    r = stage(as_alice, ["/d/a", "/missing/x"])
    assert r.status_code == 201
    RestoreRequest.objects.filter(path="/missing/x").update(
        state=S.FAILED, finished_at=timezone.now(), error_class=ErrorClass.PERMANENT, last_error="no such file")
    files = {f["path"]: f for f in poll(as_alice, r.json()["requestId"]).json()["files"]}
    assert files["/missing/x"]["state"] == "FAILED" and files["/missing/x"]["error"] == "no such file"
    assert files["/d/a"]["state"] == "SUBMITTED"


def test_archiveinfo_answers_from_what_carousel_knows_and_asks_the_stager_once_for_the_rest(as_alice, now):
    tape = Tape.objects.create(label="T1")
    FileLocation.objects.create(path="/k/one", path_key=path_key("/k/one"), tape=tape, position=0, size=1,
                                located_at=now)
    FileLocation.objects.create(path="/k/pinned", path_key=path_key("/k/pinned"), tape=tape, position=1, size=1,
                                located_at=now)
    stage(as_alice, ["/k/pinned"], diskLifetime="PT1H")
    # Restored an instant ago, so its one-hour pin runs (services.request_transition sets pin_until).
    RestoreRequest.objects.filter(path="/k/pinned").update(state=S.DONE, finished_at=now,
                                                           pin_until=now + timedelta(hours=1))

    class Counting:
        calls = []

        def locate(self, paths):
            from carousel.stagers.base import LocateError, Location
            self.calls.append(list(paths))
            return [Location(p, "T2", 5, 10) if p.startswith("/new/") else LocateError(p, "permanent", "no such file")
                    for p in paths]

    stager = Counting()
    answer = grid.archive_info(paths=["/k/one", "/k/pinned", "/new/f", "/gone/f", "rel"], now=now, stager=stager)
    assert answer == [{"path": "/k/one", "locality": "TAPE"}, {"path": "/k/pinned", "locality": "DISK_AND_TAPE"},
                      {"path": "/new/f", "locality": "TAPE"}, {"path": "/gone/f", "error": "no such file"},
                      {"path": "rel", "error": "not an absolute path: it must start with '/'"}]
    assert stager.calls == [["/gone/f", "/new/f"]]
    # what the stager found is now known: not asked again
    assert grid.archive_info(paths=["/new/f"], now=now, stager=stager) == [{"path": "/new/f", "locality": "TAPE"}]
    assert len(stager.calls) == 1


def test_archiveinfo_names_each_path_as_it_was_sent(as_alice, now):
    """"//k//one" was answered as "/k/one": a client matching the answers to its paths by their
    text found none for it."""
    FileLocation.objects.create(path="/k/one", path_key=path_key("/k/one"), tape=Tape.objects.create(label="K1"),
                                position=0, size=1, located_at=now)
    body = as_alice.post(f"{BASE}/archiveinfo", {"paths": ["//k//one", "/k/one", "/k/./one", "rel"]},
                         format="json").json()
    assert [e["path"] for e in body] == ["//k//one", "/k/one", "/k/./one", "rel"]
    assert [e.get("locality") for e in body] == ["TAPE", "TAPE", None, None] and "error" in body[2]


@pytest.mark.parametrize("slash", ["", "/"])
def test_archiveinfo_route_gives_a_locality_for_known_paths(as_alice, now, slash):
    tape = Tape.objects.create(label="T1")
    FileLocation.objects.create(path="/k/one", path_key=path_key("/k/one"), tape=tape, position=0, size=1,
                                located_at=now)
    r = as_alice.post(f"{BASE}/archiveinfo{slash}", {"paths": ["/k/one"]}, format="json")
    assert r.status_code == 200 and r.json() == [{"path": "/k/one", "locality": "TAPE"}]
    assert_problem(as_alice.post(f"{BASE}/archiveinfo{slash}", {"paths": []}, format="json"), 400)


def test_release_ends_the_callers_pins_of_that_stage_request(as_alice, alice):
    pins = pytest.importorskip("carousel.domain.pins")  # helper c's real pins
    rid = stage(as_alice, ["/d/a"]).json()["requestId"]
    calls = []
    original = pins.release_pins
    pins.release_pins = lambda **kw: calls.append(kw) or 1
    try:
        assert as_alice.post(f"{BASE}/release/{rid}", {"paths": ["/d/a"]}, format="json").status_code == 200
        assert as_alice.post(f"{BASE}/release/gfal2-placeholder-id/", {"paths": ["/d/a"]},
                             format="json").status_code == 200
        assert_problem(as_alice.post(f"{BASE}/release/{rid}", {"paths": ["/other"]}, format="json"), 400)
    finally:
        pins.release_pins = original
    # By request: the caller's requests (policy.actionable_requests) that stage request holds,
    # never every pin of its user on those paths; by path: the caller's own (policy.own_requests).
    assert calls[0]["paths"] == ["/d/a"]
    assert list(calls[0]["requests"].values_list("path", "user")) == [("/d/a", alice.pk)]
    assert calls[1]["paths"] == ["/d/a"] and set(calls[1]["requests"].values_list("user", flat=True)) == {alice.pk}


def test_service_account_stages_for_a_user_through_targeted_metadata(alice, bob, settings):
    settings.CAROUSEL_TAPE_REST_SITENAME = "BNL-TAPE"
    Account.objects.filter(user=bob).update(acts_for_others=True)
    as_bob = client_for(bob)
    files = [{"path": "/d/a", "targetedMetadata": {"BNL-TAPE": {"on_behalf_of": "alice"}}}]
    r = as_bob.post(f"{BASE}/stage/", {"files": files}, format="json")
    assert r.status_code == 201, r.content
    assert RestoreRequest.objects.get().user == alice
    bulk = Bulk.objects.get()
    assert bulk.user == alice and bulk.submitter == bob
    assert poll(as_bob, bulk.pk).status_code == 200  # the service follows what it sent
    as_alice = client_for(alice)
    assert_problem(as_alice.post(f"{BASE}/stage/", {"files": [
        {"path": "/d/b", "targetedMetadata": {"BNL-TAPE": {"on_behalf_of": "bob"}}}]}, format="json"), 403)
    assert not RestoreRequest.objects.filter(path="/d/b").exists()


def test_any_other_address_under_the_door_is_a_404_problem(as_alice, client):
    for url in (f"{BASE}/nothing", f"{BASE}/stage/a/b/c", f"{BASE}/"):
        assert_problem(as_alice.post(url, {}, format="json"), 404)
        assert_problem(client.get(url), 404)


def test_a_method_the_call_does_not_have_is_a_405_problem(as_alice):
    assert_problem(as_alice.get(f"{BASE}/archiveinfo"), 405)
    assert_problem(as_alice.put(f"{BASE}/stage", {}, format="json"), 405)


def test_a_token_refused_for_its_scopes_hears_insufficient_scope(issuer):  # noqa: F811
    """RFC 6750 section 3.1: a 403 for missing scope carries WWW-Authenticate with the error."""
    stager = bearer(issuer.mint(sub="fts", scope="storage.stage:/data"))
    rid = stage(stager, ["/atlas/data/f"]).json()["requestId"]
    poller = bearer(issuer.mint(sub="fts", scope="storage.poll:/data"))
    for refused in (stage(poller, ["/atlas/data/g"]),
                    poller.post(f"{BASE}/stage/{rid}/cancel", {"paths": ["/atlas/data/f"]}, format="json"),
                    poller.post(f"{BASE}/release/{rid}", {"paths": ["/atlas/data/f"]}, format="json"),
                    poller.delete(f"{BASE}/stage/{rid}")):
        body = assert_problem(refused, 403)
        assert refused.get("WWW-Authenticate") == 'Bearer error="insufficient_scope"', body
        assert body["title"] == "insufficient scope"
    assert RestoreRequest.objects.get().state == S.QUEUED


def test_a_refusal_that_is_not_about_scope_says_nothing_of_scopes(as_alice, settings):
    settings.CAROUSEL_TAPE_REST_SITENAME = "BNL-TAPE"
    files = [{"path": "/d/b", "targetedMetadata": {"BNL-TAPE": {"on_behalf_of": "bob"}}}]
    refused = as_alice.post(f"{BASE}/stage/", {"files": files}, format="json")
    assert_problem(refused, 403)
    assert "WWW-Authenticate" not in refused


def test_a_token_that_is_not_valid_hears_invalid_token_and_none_at_all_hears_bearer(issuer, client):  # noqa: F811
    refused = bearer("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln").post(f"{BASE}/archiveinfo", {"paths": ["/a"]},
                                                                      format="json")
    assert_problem(refused, 401)
    assert refused["WWW-Authenticate"] == 'Bearer error="invalid_token"'
    anonymous = client.post(f"{BASE}/archiveinfo", {"paths": ["/a"]}, content_type="application/json")
    assert_problem(anonymous, 401)
    assert anonymous["WWW-Authenticate"].startswith("Bearer")


def test_a_caller_past_its_rate_hears_when_to_come_back(as_alice, settings):
    rest = dict(settings.REST_FRAMEWORK)
    rest["DEFAULT_THROTTLE_RATES"] = {"account": "2/minute"}
    settings.REST_FRAMEWORK = rest
    for _ in range(2):
        assert as_alice.post(f"{BASE}/archiveinfo", {"paths": ["/a"]}, format="json").status_code == 200
    r = as_alice.post(f"{BASE}/archiveinfo", {"paths": ["/a"]}, format="json")
    assert assert_problem(r, 429)["title"] == "throttled"
    assert 1 <= int(r["Retry-After"]) <= 60


def test_discovery_answers_other_methods_with_a_problem(client):
    assert_problem(client.post("/.well-known/wlcg-tape-rest-api", {}, content_type="application/json"), 405)


@pytest.mark.parametrize("path, media, member", [
    (f"{BASE}/stage", "application/problem+json", "title"),
    ("/.well-known/wlcg-tape-rest-api", "application/problem+json", "title"),
    ("/api/v1/requests/", "application/json", "code"),
])
def test_a_host_this_server_does_not_answer_to_gets_each_doors_error_format(client, path, media, member):
    """The door answered an unknown Host header with Django's HTML "Bad Request (400)"."""
    answer = client.post(path, {"files": [{"path": "/a"}]}, content_type="application/json", HTTP_HOST="evil.example")
    assert answer.status_code == 400 and answer["Content-Type"] == media
    body = answer.json()
    assert member in body and "Host header" in body["detail"] and "evil.example" not in body["detail"]
    assert client.get("/", HTTP_HOST="evil.example").status_code == 400  # the pages keep Django's own
