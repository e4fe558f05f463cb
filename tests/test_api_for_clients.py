"""What the thin clients need of the native API: a submission's label, found again by it; and one
request's outlook (where it stands, why not yet)."""
from carousel.domain.services import restore_submit
from tests.conftest import client_for


def test_a_submission_keeps_its_label_and_is_found_by_it(alice, bob, now):
    api = client_for(alice)
    made = api.post("/api/v1/requests/", {"paths": ["/l/a", "/l/b"], "label": "xrd-42"}, format="json")
    assert made.status_code == 201
    api.post("/api/v1/requests/", {"paths": ["/l/c"], "label": "xrd-43"}, format="json")
    restore_submit(user=bob, now=now, paths=["/l/a"], label="xrd-42")
    found = api.get("/api/v1/bulks/?label=xrd-42").json()["results"]
    assert [(b["id"], b["label"], b["user"]) for b in found] == [(made.json()["bulk_id"], "xrd-42", "alice")]
    assert len(api.get("/api/v1/bulks/").json()["results"]) == 2


def test_a_label_too_long_or_with_a_nul_is_refused(alice):
    api = client_for(alice)
    for label in ("x" * 256, "a\x00b"):
        answer = api.post("/api/v1/requests/", {"paths": ["/l/a"], "label": label}, format="json")
        assert answer.status_code == 400 and "label" in answer.content.decode()
    assert api.get("/api/v1/bulks/").json()["results"] == []


def test_one_request_says_why_it_waits(alice, now):
    restore_submit(user=alice, now=now, paths=["/w/1"])
    api = client_for(alice)
    rid = api.get("/api/v1/requests/").json()["results"][0]["id"]
    body = api.get(f"/api/v1/requests/{rid}/").json()
    assert body["state"] == "queued" and body["disk_path"] is None
    assert any("not located yet" in reason for reason in body["outlook"]["reasons"])
