"""Bad input on the Tape REST door (issue 25): refused as the native API refuses it, by the same
code (api/parsers.py, carousel/domain/paths.py), with a 400 or 413 problem document a person can
act on, and nothing stored."""
import io
import json
import uuid

import pytest
from rest_framework.test import APIClient

from carousel.models import Account, Bulk, RestoreRequest

BASE = "/api/tape-rest/v1"
pytestmark = pytest.mark.django_db


def post_raw(client, url, text):
    return client.generic("POST", url, text, content_type="application/json")


def assert_problem(response, status, *words):
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/problem+json")
    body = response.json()
    assert body["status"] == status and body["title"] and body["detail"]
    for word in words:
        assert word in body["detail"], body["detail"]
    return body


@pytest.fixture
def rid(as_alice):
    r = as_alice.post(f"{BASE}/stage", {"files": [{"path": "/d/a"}]}, format="json")
    assert r.status_code == 201
    return r.json()["requestId"]


@pytest.fixture
def urls(rid):
    """Every call of the door with a body, and the member that holds its list."""
    return {f"{BASE}/stage": "files", f"{BASE}/stage/{rid}/cancel": "paths", f"{BASE}/release/{rid}": "paths",
            f"{BASE}/archiveinfo": "paths"}


def nothing_changed():
    assert Bulk.objects.count() == 1 and RestoreRequest.objects.get().state == "queued"


def listing(member, paths):
    return {member: [{"path": p} for p in paths] if member == "files" else paths}


NESTED = "[" * 100_000 + "]" * 100_000


BAD_BODIES = [
    ("not json", ["JSON parse error"]),
    ('{"files": [{"path": "/a\\ud800"}], "paths": ["/a\\ud800"]}', ["lone surrogate"]),
    (NESTED, ["nested"]),
    ('{"paths": ' + "[" * 100 + "]" * 100 + ', "files": []}', ["nested more than 32"]),
]


def test_a_body_the_parser_refuses_is_a_400_with_the_native_apis_words(as_alice, urls):
    for text, words in BAD_BODIES:
        native = post_raw(as_alice, "/api/v1/requests/", text)
        assert native.status_code == 400
        for url in urls:
            door = assert_problem(post_raw(as_alice, url, text), 400, *words)
            assert door["detail"] == native.json()["detail"]  # one parser serves both doors
    nothing_changed()


def test_a_body_that_is_not_an_object_is_a_400(as_alice, urls):
    for body in ([], "text", 3, None):
        for url, member in urls.items():
            # The example is this call's shape (the stage call's was the others', a probe found).
            assert_problem(post_raw(as_alice, url, json.dumps(body)), 400, "JSON object", f'{{"{member}": [')
    nothing_changed()


def test_a_list_that_is_missing_empty_or_of_the_wrong_type_is_a_400(as_alice, urls):
    for value in (None, "/d/a", {"path": "/d/a"}, 7, []):
        for url, member in urls.items():
            body = {} if value is None else {member: value}
            assert_problem(as_alice.post(url, body, format="json"), 400, f"{member}: expected a non-empty list")
    nothing_changed()


def test_an_entry_that_is_not_a_string_is_a_400_that_says_where(as_alice, urls):
    # In JSON's words: "got NoneType" meant nothing to a client that sent null (a probe's finding).
    for entry, words in [(1, "expected a string, got the number 1"), (None, "expected a string, got null"),
                         (["/d/a"], "expected a string, got an array")]:
        for url, member in urls.items():
            body = {member: [{"path": "/d/a"}, {"path": entry}]} if member == "files" else {member: ["/d/a", entry]}
            problem = assert_problem(as_alice.post(url, body, format="json"), 400, words)
            assert f"{member}[1]" in problem["detail"] or problem["errors"][0]["index"] == 1
    nothing_changed()


def test_a_bad_path_is_refused_with_the_native_apis_words(as_alice, rid):
    for path, words in [("relative/a", "absolute"), ("/d/../etc/passwd", "'..'"), ("/d/a\nb", "control character"),
                        ("/d/", "ends with '/'"), ("/" + "x" * 5000, "longer than 4096 bytes")]:
        native = as_alice.post("/api/v1/requests/", {"paths": [path]}, format="json")
        assert native.status_code == 400 and words in json.dumps(native.json())
        assert_problem(as_alice.post(f"{BASE}/stage", {"files": [{"path": path}]}, format="json"), 400, words)
        assert_problem(as_alice.post(f"{BASE}/stage/{rid}/cancel", {"paths": [path]}, format="json"), 400, words)
        assert_problem(as_alice.post(f"{BASE}/release/{rid}", {"paths": [path]}, format="json"), 400, words)
        # archiveinfo answers path by path, as the specification does: the bad one gets its own error.
        r = as_alice.post(f"{BASE}/archiveinfo", {"paths": [path, "/d/a"]}, format="json")
        assert r.status_code == 200
        bad, good = r.json()
        assert set(bad) == {"path", "error"} and bad["path"] == path and words in bad["error"]
        assert len({"locality", "error"} & set(good)) == 1
    nothing_changed()


def test_more_paths_than_a_stage_request_may_hold_is_a_413_everywhere(as_alice, urls, settings):
    settings.CAROUSEL_TAPE_REST_MAX_FILES = 2
    for url, member in urls.items():
        assert_problem(as_alice.post(url, listing(member, ["/d/a", "/d/b", "/d/c"]), format="json"), 413,
                       "limit is 2")
    nothing_changed()


def test_a_body_larger_than_the_limit_is_a_413(as_alice, urls, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    for url, member in urls.items():
        assert_problem(as_alice.post(url, listing(member, ["/d/" + "x" * 100] * 20), format="json"), 413,
                       "larger than 1,000 bytes")
    nothing_changed()


def test_a_disk_lifetime_out_of_the_native_apis_bounds_is_a_400(as_alice):
    for lifetime, words in [("P999999999999D", "not an ISO 8601 duration"), ("PT0S", "out of range"),
                            ("-PT1H", "out of range"), ("P400D", "out of range"),
                            ("forever", "not an ISO 8601 duration"), (3600, "not an ISO 8601 duration"),
                            # Django's parse_duration took these two, which are not ISO 8601.
                            ("1 day", "not an ISO 8601 duration"), ("86400", "not an ISO 8601 duration"),
                            ("", "not an ISO 8601 duration"), ("P", "not an ISO 8601 duration"),
                            ("PT", "not an ISO 8601 duration"), ("P1Y", "years and months have no fixed length"),
                            ("P1M", "years and months have no fixed length")]:
        r = as_alice.post(f"{BASE}/stage", {"files": [{"path": "/e/a", "diskLifetime": lifetime}]}, format="json")
        assert_problem(r, 400, "files[0].diskLifetime", words)
    assert not RestoreRequest.objects.exists()


@pytest.mark.parametrize("lifetime, seconds", [("P1W", 7 * 86400), ("P2DT12H", 2.5 * 86400), ("PT1H30M", 5400),
                                               ("PT0.5S", None), ("PT90S", 90), ("P52W", 364 * 86400)])
def test_a_disk_lifetime_is_read_as_iso_8601_weeks_included(as_alice, lifetime, seconds):
    """P1W and P52W, valid ISO 8601, were refused as "not an ISO 8601 duration"."""
    r = as_alice.post(f"{BASE}/stage", {"files": [{"path": "/e/a", "diskLifetime": lifetime}]}, format="json")
    if seconds is None:  # below the native API's 1 second
        assert_problem(r, 400, "files[0].diskLifetime", "out of range")
        return
    assert r.status_code == 201, r.content
    assert RestoreRequest.objects.get().pin_lifetime.total_seconds() == seconds


def test_on_behalf_of_that_is_not_a_user_name_is_a_400(bob, alice, settings):
    settings.CAROUSEL_TAPE_REST_SITENAME = "BNL-TAPE"
    Account.objects.filter(user=bob).update(acts_for_others=True)
    client = APIClient()
    client.force_authenticate(bob)
    for who in (["alice"], {"name": "alice"}, 7, ""):
        files = [{"path": "/d/a", "targetedMetadata": {"BNL-TAPE": {"on_behalf_of": who}}}]
        assert_problem(client.post(f"{BASE}/stage", {"files": files}, format="json"), 400, "on_behalf_of")
    assert not RestoreRequest.objects.exists()


def test_unknown_ids_are_404_on_every_call(as_alice):
    for rid in (str(uuid.uuid4()), "not-a-uuid", "0" * 5000):
        assert_problem(as_alice.get(f"{BASE}/stage/{rid}"), 404, "no stage request")
        assert_problem(as_alice.delete(f"{BASE}/stage/{rid}"), 404, "no stage request")
        for url in (f"{BASE}/stage/{rid}/cancel", f"{BASE}/release/{rid}"):
            assert_problem(as_alice.post(url, {"paths": ["/d/a"]}, format="json"), 404, "no stage request")


def test_any_content_type_or_none_is_read_as_json(as_alice):
    body = json.dumps({"files": [{"path": "/d/a"}]})
    assert as_alice.generic("POST", f"{BASE}/stage", body, content_type="text/plain").status_code == 201
    assert as_alice.generic("POST", f"{BASE}/stage", body, content_type="").status_code == 201


def test_a_browser_session_posts_with_its_csrf_token_and_is_refused_without(alice):
    """A signed-in browser is a client like any other (it got 415 before): CSRF as on the native API."""
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(alice)
    body = {"files": [{"path": "/d/a"}]}
    refused = client.post(f"{BASE}/stage", body, format="json")
    assert_problem(refused, 403, "CSRF")
    secret = "a" * 32
    client.cookies["csrftoken"] = secret
    assert client.post(f"{BASE}/stage", body, format="json", HTTP_X_CSRFTOKEN=secret).status_code == 201


def _through_chunked(body, *, terminated=True, limit=None, settings=None):
    """What Django reads of a chunked body that passed carousel.infra.chunked."""
    from django.core.handlers.wsgi import WSGIRequest

    from carousel.infra.chunked import ChunkedBodies

    seen = {}

    def app(environ, start_response):
        request = WSGIRequest(environ)
        seen["length"] = environ.get("CONTENT_LENGTH")
        seen["body"] = request._stream.read()  # what a parser gets, whatever the limit
        return []

    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": f"{BASE}/archiveinfo", "wsgi.input": io.BytesIO(body),
               "HTTP_TRANSFER_ENCODING": "chunked", "CONTENT_TYPE": "application/json", "SERVER_NAME": "testserver",
               "SERVER_PORT": "80", "wsgi.url_scheme": "http"}
    if terminated:
        environ["wsgi.input_terminated"] = True
    ChunkedBodies(app)(environ, lambda *a: None)
    return seen


def test_a_chunked_body_is_read_whole_and_a_huge_one_keeps_a_length_past_the_limit(settings):
    body = json.dumps({"paths": ["/d/a"]}).encode()
    assert _through_chunked(body) == {"length": str(len(body)), "body": body}
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10
    assert _through_chunked(b"x" * 100)["length"] == "11"  # past the limit: 413, read no further


@pytest.mark.parametrize("path, media, member", [(f"{BASE}/stage", "application/problem+json", "title"),
                                                 ("/api/v1/requests/", "application/json", "code")])
def test_a_chunked_body_a_server_cannot_end_is_a_411_saying_what_to_send(path, media, member):
    """Under `make run` (Django's runserver, which does not de-chunk) a chunked stage was read as
    an empty body: 400 "files: expected a non-empty list". Now 411, saying to send a length."""
    from carousel.infra.chunked import ChunkedBodies

    started = []
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": path, "wsgi.input": io.BytesIO(b'{"files": []}'),
               "HTTP_TRANSFER_ENCODING": "chunked", "CONTENT_TYPE": "application/json"}
    body = b"".join(ChunkedBodies(lambda *a: pytest.fail("the request went on"))(
        environ, lambda status, headers: started.append((status, dict(headers)))))
    (status, headers), = started
    assert status == "411 Length Required" and headers["Content-Type"] == media
    answer = json.loads(body)
    assert member in answer and "send it with a Content-Length" in answer["detail"]


def test_the_native_release_refuses_the_entries_the_door_refuses(as_alice, rid):
    """requests/release/ took {"paths": [1]} as the path "1" (issue 25): its entries are checked
    as every door checks a path."""
    for path, words in [(1, "expected a string, got the number 1"), ("relative", "absolute"), ("/d/../x", "'..'")]:
        native = as_alice.post("/api/v1/requests/release/", {"paths": ["/d/a", path]}, format="json")
        assert native.status_code == 400 and words in native.json()["detail"], native.content
        assert "1" in native.json()["fields"]["paths"]
        door = as_alice.post(f"{BASE}/release/{rid}", {"paths": ["/d/a", path]}, format="json")
        assert_problem(door, 400, words)
    assert as_alice.post("/api/v1/requests/release/", {"paths": ["/d//a"]}, format="json").json() == {"released": 0}
