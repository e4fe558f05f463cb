import json

import pytest

from carousel import tasks
from carousel.domain import selectors
from carousel.models import Bulk, BulkItem, Control, Intake, RestoreRequest

URL = "/api/v1/requests/"


def nothing_stored():
    return RestoreRequest.objects.count() == 0 and Bulk.objects.count() == 0 and BulkItem.objects.count() == 0


def test_it_accepts_paths_and_returns_the_bulk(as_alice, alice):
    r = as_alice.post(URL, {"paths": ["/star/a.daq", "/star/b.daq", "//star//a.daq"], "priority": 2,
                            "pin_lifetime": "PT2H"}, format="json")
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["files"] == 2 and body["created"] == 2 and body["existing"] == 0
    bulk = Bulk.objects.get(id=body["bulk_id"])
    assert bulk.user == alice and selectors.bulk_requests(bulk).count() == 2
    reqs = RestoreRequest.objects.filter(user=alice).order_by("path")
    assert [r.path for r in reqs] == ["/star/a.daq", "/star/b.daq"]
    assert {r.state for r in reqs} == {"queued"} and {r.priority for r in reqs} == {2}
    assert reqs[0].pin_lifetime.total_seconds() == 7200
    assert reqs[0].group.name == "analysis"


BAD_PATHS = [
    ("relative/path", "not an absolute path"),
    ("", "empty path"),
    ("/a/b\x00c", "NUL byte"),
    ("/a/../etc/passwd", "'..' component"),
    ("/" + "x" * 4096, "longer than 4096 bytes"),
    ("/a/b\nc", "control character"),
    ("/a/b\x85c", "control character or a line break"),  # C1: accepted before, a line break in restored.txt
    ("/a/b\u2028c", "control character or a line break"),
    (42, "expected a string"),
]


@pytest.mark.parametrize("bad,message", BAD_PATHS)
def test_it_refuses_a_bad_path_and_stores_nothing(as_alice, bad, message):
    r = as_alice.post(URL, {"paths": ["/good/one", bad, "/good/two"]}, format="json")
    assert r.status_code == 400
    body = r.json()
    assert body["code"] == "invalid_submission"
    assert "1 of 3 paths were rejected; nothing was stored" in body["detail"]
    assert body["errors"][0]["index"] == 1 and body["errors"][0]["line"] == 2
    assert message in body["errors"][0]["message"]
    assert nothing_stored()


def test_it_lists_every_bad_line(as_alice):
    r = as_alice.post(URL, {"paths": ["rel1", "/ok", "rel2", "/x/.."]}, format="json")
    assert r.status_code == 400
    assert [e["line"] for e in r.json()["errors"]] == [1, 3, 4]
    assert nothing_stored()


def test_it_refuses_an_empty_list(as_alice):
    r = as_alice.post(URL, {"paths": []}, format="json")
    assert r.status_code == 400 and "the list of paths is empty" in r.json()["detail"]
    assert nothing_stored()


def test_it_refuses_more_paths_than_the_limit(as_alice, settings):
    limit = settings.CAROUSEL_MAX_PATHS_PER_SUBMISSION
    r = as_alice.post(URL, {"paths": [f"/f/{i}" for i in range(limit + 1)]}, format="json")
    assert r.status_code == 400
    assert f"{limit + 1} paths in one submission; the limit is {limit}" in r.json()["detail"]
    assert nothing_stored()


def test_it_refuses_unknown_fields(as_alice):
    r = as_alice.post(URL, {"paths": ["/a"], "lifetime": 5}, format="json")
    assert r.status_code == 400
    assert "unknown field(s): lifetime" in r.json()["detail"]
    assert nothing_stored()


def test_it_refuses_malformed_json(as_alice):
    r = as_alice.post(URL, data='{"paths": ["/a",', content_type="application/json")
    assert r.status_code == 400
    assert r.json()["code"] == "parse_error" and "JSON parse error" in r.json()["detail"]
    assert nothing_stored()


def test_it_refuses_a_body_that_is_not_an_object(as_alice):
    r = as_alice.post(URL, data=json.dumps(["/a"]), content_type="application/json")
    assert r.status_code == 400 and "expected a JSON object" in r.json()["detail"]
    assert nothing_stored()


def test_it_refuses_paths_that_are_not_a_list(as_alice):
    r = as_alice.post(URL, {"paths": "/a"}, format="json")
    assert r.status_code == 400 and r.json()["detail"].startswith("paths:")
    assert nothing_stored()


@pytest.mark.parametrize("field,value,message", [
    ("priority", 4, "priority: Ensure this value is less than or equal to 3."),
    ("deadline", "yesterday", "deadline: Datetime has wrong format"),
    ("pin_lifetime", "forever", "pin_lifetime: not a duration: give one in ISO 8601, such as PT12H or P7D, or in "
                                "seconds, such as 3600."),
])
def test_it_refuses_bad_options(as_alice, field, value, message):
    r = as_alice.post(URL, {"paths": ["/a"], field: value}, format="json")
    assert r.status_code == 400 and message in r.json()["detail"]
    assert nothing_stored()


def test_it_refuses_a_deadline_in_the_past(as_alice):
    r = as_alice.post(URL, {"paths": ["/a"], "deadline": "2001-01-01T00:00:00Z"}, format="json")
    assert r.status_code == 400 and r.json()["detail"] == "deadline is in the past"
    assert nothing_stored()


def test_it_answers_429_over_the_queued_ceiling(as_alice, alice):
    Control.objects.update_or_create(id=1, defaults={"default_queued_ceiling": 3})
    assert as_alice.post(URL, {"paths": ["/a", "/b"]}, format="json").status_code == 201
    r = as_alice.post(URL, {"paths": ["/c", "/d"]}, format="json")
    assert r.status_code == 429
    assert r.json()["detail"].startswith("you have 2 active requests and this submission adds 2; your ceiling is 3")
    assert RestoreRequest.objects.count() == 2 and Bulk.objects.count() == 1


def test_a_privileged_user_gets_a_larger_ceiling(as_alice, alice):
    Control.objects.update_or_create(id=1, defaults={"default_queued_ceiling": 1})
    alice.account.queued_ceiling = 10
    alice.account.save()
    assert as_alice.post(URL, {"paths": ["/a", "/b", "/c"]}, format="json").status_code == 201


def test_it_needs_authentication(client, db):
    r = client.post(URL, {"paths": ["/a"]}, content_type="application/json")
    assert r.status_code in (401, 403)
    assert nothing_stored()


def test_it_takes_100000_paths_in_one_post(as_alice):
    paths = [f"/star/raw/run{i // 1000:03d}/file_{i:06d}.daq" for i in range(100_000)]
    r = as_alice.post(URL, {"paths": paths}, format="json")
    assert r.status_code == 201
    assert r.json()["created"] == 100_000
    # Durable in the intake at the answer (carousel/domain/intake.py); reading the submission counts
    # them as queued and moves nothing; the task sent at the commit queues them.
    bulk = r.json()["bulk_id"]
    assert Intake.objects.filter(bulk_id=bulk).count() == 100_000
    assert as_alice.get(f"/api/v1/bulks/{bulk}/").json()["states"]["queued"] == 100_000
    assert Intake.objects.filter(bulk_id=bulk).count() == 100_000
    tasks.settle_intake(bulk)
    assert not Intake.objects.exists()
    # Every request belongs to the submission (the creating one is on the request row).
    assert RestoreRequest.objects.count() == 100_000
    assert RestoreRequest.objects.filter(selectors.in_bulk(bulk)).count() == 100_000
