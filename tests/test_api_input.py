"""Malformed input: every one is a 400 (or 404/413) in the API's error format, saying what is
wrong and where, and nothing is stored. None of these may answer 500."""
from datetime import datetime, timedelta, timezone as dt_timezone

import pytest
from django.test import override_settings

from carousel.models import Bulk, BulkItem, RestoreRequest
from carousel.domain.services import restore_submit

URL = "/api/v1/requests/"


def nothing_stored():
    return RestoreRequest.objects.count() == 0 and Bulk.objects.count() == 0 and BulkItem.objects.count() == 0


def api_error(r, status):
    assert r.status_code == status, r.content[:500]
    assert r["Content-Type"].startswith("application/json"), r["Content-Type"]
    body = r.json()
    assert body["status"] == status and body["code"] and body["detail"]
    return body


def raw_post(client, body):
    return client.generic("POST", URL, body, content_type="application/json")


def test_a_lone_surrogate_in_a_path_is_refused(as_alice):
    body = api_error(raw_post(as_alice, '{"paths": ["/ok", "/a/\\ud800b"]}'), 400)
    assert "surrogate" in body["detail"] and "paths[1]" in body["detail"]
    assert nothing_stored()


def test_a_lone_surrogate_in_the_destination_is_refused(as_alice):
    body = api_error(raw_post(as_alice, '{"paths": ["/ok"], "destination": "/d/\\udfff"}'), 400)
    assert "surrogate" in body["detail"] and "destination" in body["detail"]
    assert nothing_stored()


def test_deeply_nested_json_is_refused(as_alice):
    body = api_error(raw_post(as_alice, "[" * 100_000 + "]" * 100_000), 400)
    assert "nested" in body["detail"]
    assert nothing_stored()


@pytest.mark.parametrize("param", ["path", "tape", "state", "bulk", "since"])
def test_a_nul_in_a_query_parameter_is_refused(as_alice, param):
    body = api_error(as_alice.get(URL, {param: "a\x00b"}), 400)
    assert param in body["detail"]


@pytest.mark.parametrize("url, param", [("/api/v1/bulks/", "label"), ("/api/v1/bulks/", "page_size"),
                                        ("/api/v1/summary/", "x"), ("/api/v1/usage/", "by")])
def test_a_nul_in_any_query_parameter_is_refused_on_every_list(as_alice, url, param):
    """?label=a%00b reached PostgreSQL and answered 500 (issue 25)."""
    body = api_error(as_alice.get(url, {param: "a\x00b"}), 400)
    assert body["fields"] == {param: ["contains a NUL byte"]}


@pytest.mark.parametrize("url", ["/api/tape-rest/v1/stage/some-id", "/.well-known/wlcg-tape-rest-api"])
def test_a_nul_in_a_query_parameter_is_refused_on_the_tape_rest_door(as_alice, url):
    """The discovery path, the door's too, was answered in the API's format (carousel/infra/doors.py)."""
    r = as_alice.get(url, {"x": "\x00"})
    assert r.status_code == 400 and r["Content-Type"] == "application/problem+json"
    assert "NUL" in r.json()["detail"] and r.json()["title"] == "bad request"


@pytest.mark.parametrize("url", [URL, "/api/v1/bulks/"])
@pytest.mark.parametrize("inside", ["p=abc", "p=", "r=1&p=x", "p=1e400", "p=2026-01-01T00:00:00Z", "o=1&p=1"])
def test_a_forged_cursor_is_refused(as_alice, alice, url, inside):
    """A cursor is base64 a client can write: a position that is not a value of the list's
    order was a 500 (issue 25)."""
    import base64
    restore_submit(user=alice, now=datetime.now(dt_timezone.utc), paths=["/c/1", "/c/2"])
    r = as_alice.get(url, {"cursor": base64.b64encode(inside.encode()).decode()})
    if r.status_code != 200:  # a position that happens to be a value of the order is a page
        assert "not a cursor this API gave out" in str(api_error(r, 400)["fields"]["cursor"])


@pytest.mark.parametrize("param", ["since", "until"])
@pytest.mark.parametrize("value", ["0001-01-01T00:00+01:00", "9999-12-31T23:59-01:00", "2026-01-01T00:00+24:00",
                                   "2026-02-30T00:00Z", "yesterday"])
def test_a_bad_time_in_a_filter_is_refused(as_alice, param, value):
    body = api_error(as_alice.get(URL, {param: value}), 400)
    assert param in body["fields"]


@pytest.mark.parametrize("offset", [timedelta(hours=16), timedelta(hours=-23, minutes=-59), timedelta(hours=15)])
def test_any_offset_under_a_day_filters_by_the_instant_it_names(as_alice, alice, offset):
    # PostgreSQL refuses offsets of 16 hours or more (it answered 500): the API turns every
    # time into UTC first.
    restore_submit(user=alice, now=datetime(2026, 1, 1, 12, tzinfo=dt_timezone.utc), paths=["/a"])
    zone = dt_timezone(offset)
    before = datetime(2026, 1, 1, 11, 59, tzinfo=dt_timezone.utc).astimezone(zone).isoformat()
    after = datetime(2026, 1, 1, 12, 1, tzinfo=dt_timezone.utc).astimezone(zone).isoformat()
    assert len(as_alice.get(URL, {"until": before}).json()["results"]) == 0
    assert len(as_alice.get(URL, {"until": after}).json()["results"]) == 1
    assert len(as_alice.get(URL, {"since": before}).json()["results"]) == 1
    assert len(as_alice.get(URL, {"since": after}).json()["results"]) == 0


@pytest.mark.parametrize("query", ["until=", "since=", "tape=", "path=", "bulk=", "page_size=null", "page_size=0",
                                   "page_size=-1", "page_size=1001", "page_size=", "cursor=garbage",
                                   "cursor="])
def test_an_empty_or_senseless_list_parameter_is_refused(as_alice, query):
    body = api_error(as_alice.get(f"{URL}?{query}"), 400)
    # A list of errors, as for every field (page_size's and cursor's were a string: a probe).
    errors = body["fields"][query.split("=")[0]]
    assert isinstance(errors, list) and errors and all(isinstance(e, str) for e in errors), body


@pytest.mark.parametrize("url", ["/api/v1/requests/", "/api/v1/bulks/", "/api/v1/usage/"])
def test_a_parameter_given_twice_is_refused(as_alice, url):
    """?state=done&state=failed was read as state=failed alone, and listed none of the done
    ones (a probe's finding)."""
    name = {"/api/v1/requests/": "state", "/api/v1/bulks/": "label", "/api/v1/usage/": "by"}[url]
    first, second = {"state": ("done", "failed"), "label": ("a", "b"), "by": ("user", "group")}[name]
    body = api_error(as_alice.get(f"{url}?{name}={first}&{name}={second}"), 400)
    assert "given 2 times: give it once" in body["fields"][name][0]


@pytest.mark.parametrize("url, query", [("/api/v1/usage/", "until="), ("/api/v1/usage/", "since="),
                                        ("/api/v1/usage/", "by="), ("/api/v1/usage/csv/", "until="),
                                        ("/api/v1/bulks/", "label=")])
def test_an_empty_filter_of_the_usage_report_or_the_submissions_is_refused(as_alice, url, query):
    """As on the list of requests (the README: 400 for an empty filter such as ?until=); before,
    each was taken as not given: the default period, or every submission for ?label=."""
    body = api_error(as_alice.get(f"{url}?{query}"), 400)
    assert query.split("=")[0] in body["fields"]


def test_a_good_page_size_still_pages(as_alice, alice, now):
    restore_submit(user=alice, now=now, paths=["/a", "/b", "/c"])
    r = as_alice.get(URL, {"page_size": "2"})
    assert r.status_code == 200 and len(r.json()["results"]) == 2 and r.json()["next"]
    assert len(as_alice.get(r.json()["next"]).json()["results"]) == 1


@pytest.mark.parametrize("lifetime", ["-PT1H", "-5", "PT0S", "0", "P999999999D", "P366D", "P9999999999D", "soon"])
def test_a_senseless_pin_lifetime_is_refused(as_alice, lifetime):
    body = api_error(as_alice.post(URL, {"paths": ["/a"], "pin_lifetime": lifetime}, format="json"), 400)
    assert "pin_lifetime" in body["fields"]
    assert nothing_stored()


@pytest.mark.parametrize("lifetime", ["PT1H", "3600", "P365D"])
def test_a_sensible_pin_lifetime_is_kept(as_alice, lifetime):
    r = as_alice.post(URL, {"paths": ["/a"], "pin_lifetime": lifetime}, format="json")
    assert r.status_code == 201, r.content


def test_the_service_refuses_a_senseless_pin_lifetime_from_any_door(alice, now):
    from datetime import timedelta

    from carousel.domain.exceptions import InvalidSubmission

    for bad in (timedelta(0), timedelta(hours=-1), timedelta(days=999_999_999)):
        with pytest.raises(InvalidSubmission, match="pin_lifetime"):
            restore_submit(user=alice, now=now, paths=["/a"], pin_lifetime=bad)
    assert nothing_stored()


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1000)
def test_a_body_past_the_limit_is_413_in_the_error_format(as_alice):
    paths = [f"/p/{i:08d}" for i in range(200)]
    body = api_error(as_alice.post(URL, {"paths": paths}, format="json"), 413)
    assert "1,000 bytes" in body["detail"] and "split" in body["detail"]
    assert nothing_stored()


def test_the_body_limit_fits_the_largest_submission(settings):
    # 100,000 paths (the per-submission limit) of 600 bytes each, as JSON.
    largest = settings.CAROUSEL_MAX_PATHS_PER_SUBMISSION * (600 + len('"",'))
    assert settings.DATA_UPLOAD_MAX_MEMORY_SIZE >= largest


@pytest.mark.parametrize("url", ["/api/v1/requests/abc/", "/api/v1/requests/12/nope/", "/api/v1/nothing/",
                                 "/api/v1/requests/99999999/", "/api/v1/requests/99999999999999999999999/",
                                 "/api/v1/bulks/not-a-uuid/", "/api/v1/bulks/00000000-0000-0000-0000-000000000000/",
                                 "/api/v1/requests/" + "9" * 5000 + "/", "/api/v1/requests/" + "9" * 5000 + "/cancel/"])
def test_an_unknown_address_under_the_api_is_a_json_404(as_alice, url):
    body = api_error(as_alice.get(url), 404)
    assert body["code"] == "not_found"


@pytest.mark.parametrize("ids", [[0], [2**63], ["x"], [], "1", [1.5]])
def test_senseless_ids_in_a_cancel_are_refused(as_alice, ids):
    body = api_error(as_alice.post(URL + "cancel/", {"ids": ids}, format="json"), 400)
    assert "ids" in body["fields"]


def test_a_huge_number_in_json_is_refused(as_alice):
    api_error(raw_post(as_alice, '{"paths": ["/a"], "priority": ' + "9" * 5000 + "}"), 400)
    assert nothing_stored()


@pytest.mark.parametrize("ids", ["²", "1" * 5000, "-1", "0", str(2**63), "1e3"])
def test_the_web_cancel_form_refuses_senseless_ids(client, alice, now, ids):
    restore_submit(user=alice, now=now, paths=["/a"])
    client.force_login(alice)
    r = client.post("/requests/cancel/", {"ids": [ids]})
    assert r.status_code == 400
    assert "not a request id" in r.content.decode()
    assert RestoreRequest.objects.get().state == "queued"
