"""Grid identities: WLCG JWTs from a trusted issuer on loopback, API tokens with the Bearer
keyword, and service accounts acting for users."""
import time

import pytest
from django.contrib.auth.models import Group
from django.core.cache import cache
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from carousel.grid import tokens as wlcg
from carousel.models import Account, Bulk, PathPrefix, RestoreRequest, WlcgGroupMap, WlcgIdentity
from tests.conftest import client_for
from tests.fakes.wlcg_issuer import Issuer

BASE = "/api/tape-rest/v1"
AUD = "https://carousel.test"
pytestmark = pytest.mark.django_db


@pytest.fixture
def issuer(settings):
    cache.clear()
    with Issuer() as iss:
        settings.CAROUSEL_WLCG_ISSUERS = [{"issuer": iss.url, "audiences": [AUD], "base_path": "/atlas",
                                           "name": "atlas"}]
        yield iss
    cache.clear()


def bearer(token):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def stage(client, *paths):
    return client.post(f"{BASE}/stage/", {"files": [{"path": p} for p in paths]}, format="json")


@pytest.mark.parametrize("kid", ["rsa-1", "ec-1"])
def test_a_good_token_stages_as_its_subject_made_on_first_use(issuer, kid):
    client = bearer(issuer.mint(sub="u-123", kid=kid, scope="storage.stage:/data"))
    r = stage(client, "/atlas/data/f1", "/atlas/data/sub/f2")
    assert r.status_code == 201, r.content
    identity = WlcgIdentity.objects.get(issuer=issuer.url, subject="u-123")
    assert identity.user.username == "atlas:u-123"
    assert set(RestoreRequest.objects.values_list("user", flat=True)) == {identity.user.pk}
    rid = r.json()["requestId"]
    assert client.get(f"{BASE}/stage/{rid}").status_code == 200
    # the same subject again: the same user
    assert stage(bearer(issuer.mint(sub="u-123", scope="storage.stage:/")), "/atlas/x").status_code == 201
    assert WlcgIdentity.objects.count() == 1


@pytest.mark.parametrize("case", ["expired", "wrong audience", "wrong issuer", "tampered", "bad version",
                                  "scope without path", "unknown kid", "hmac"])
def test_bad_tokens_are_401_and_nothing_stored(issuer, case):
    token = {
        "expired": lambda: issuer.mint(exp_in=-120),
        "wrong audience": lambda: issuer.mint(aud="https://elsewhere.test"),
        "wrong issuer": lambda: issuer.mint(iss="https://other-issuer.test/"),
        "tampered": lambda: _tamper(issuer.mint()),
        "bad version": lambda: issuer.mint(ver="2.0"),
        "scope without path": lambda: issuer.mint(scope="storage.stage"),
        "unknown kid": lambda: issuer.mint(kid="forged"),
        "hmac": lambda: _hmac(issuer),
    }[case]()
    r = stage(bearer(token), "/atlas/data/f")
    assert r.status_code == 401, r.content
    assert r["Content-Type"].startswith("application/problem+json")
    assert not RestoreRequest.objects.exists() and not WlcgIdentity.objects.exists()


def _tamper(token):
    import base64
    import json
    head, payload, sig = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    claims["sub"] = "root"
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"{head}.{forged}.{sig}"


def _hmac(issuer):
    import jwt as pyjwt
    return pyjwt.encode({"iss": issuer.url, "sub": "x", "aud": AUD, "exp": int(time.time()) + 60,
                         "wlcg.ver": "1.0", "scope": "storage.stage:/"}, "a-shared-secret-that-is-long-enough-for-hs256", algorithm="HS256",
                        headers={"kid": "rsa-1"})


def test_any_audience_is_accepted(issuer):
    assert stage(bearer(issuer.mint(aud=wlcg.ANY_AUDIENCE)), "/atlas/f").status_code == 201


def test_scopes_are_relative_to_the_base_path_and_match_whole_components(issuer):
    client = bearer(issuer.mint(scope="storage.stage:/data"))
    assert stage(client, "/atlas/database/f").status_code == 403  # not /data
    assert stage(client, "/data/f").status_code == 403  # another VO's tree
    assert stage(client, "/atlas/data/f", "/atlas/mc/f").status_code == 403  # one outside: all refused
    assert not RestoreRequest.objects.exists()
    assert stage(client, "/atlas/data/f").status_code == 201


def test_poll_scope_polls_and_asks_archiveinfo_but_does_not_stage(issuer):
    stager = bearer(issuer.mint(sub="fts", scope="storage.stage:/"))
    rid = stage(stager, "/atlas/data/f").json()["requestId"]
    poller = bearer(issuer.mint(sub="fts", scope="storage.poll:/data"))
    assert poller.get(f"{BASE}/stage/{rid}").status_code == 200
    r = poller.post(f"{BASE}/archiveinfo", {"paths": ["/atlas/data/zzz"]}, format="json")
    assert r.status_code == 200
    assert stage(poller, "/atlas/data/g").status_code == 403
    assert poller.post(f"{BASE}/stage/{rid}/cancel", {"paths": ["/atlas/data/f"]}, format="json").status_code == 403
    assert RestoreRequest.objects.get().state == "queued"
    assert bearer(issuer.mint(sub="fts", scope="storage.poll:/mc")).get(f"{BASE}/stage/{rid}").status_code == 403


def test_missing_stage_scope_is_403(issuer):
    client = bearer(issuer.mint(scope="storage.read:/"))
    assert stage(client, "/atlas/f").status_code == 403
    assert not RestoreRequest.objects.exists()


def test_a_tokens_groups_apply_to_its_own_request_on_top_of_its_scopes(issuer, settings):
    """wlcg.groups choose the path prefixes of that request only, never instead of a scope; the
    membership is recorded once, not rewritten by each token (issue 25)."""
    settings.CAROUSEL_PATH_AUTHORIZATION = "group-prefixes"
    prod, users = Group.objects.create(name="atlas-production"), Group.objects.create(name="atlas-users")
    PathPrefix.objects.create(group=prod, prefix="/atlas/prod")
    PathPrefix.objects.create(group=users, prefix="/atlas/user")
    WlcgGroupMap.objects.create(wlcg_group="/atlas/production", group=prod)
    WlcgGroupMap.objects.create(wlcg_group="/atlas/users", group=users)
    assert stage(bearer(issuer.mint(sub="svc", scope=None, groups=["/atlas/production"])),
                 "/atlas/prod/f").status_code == 403  # groups without a storage scope: nothing
    as_prod = bearer(issuer.mint(sub="svc", scope="storage.stage:/", groups=["/atlas", "/atlas/production"]))
    as_users = bearer(issuer.mint(sub="svc", scope="storage.stage:/", groups=["/atlas/users"]))
    assert stage(as_prod, "/atlas/prod/f").status_code == 201
    assert stage(as_users, "/atlas/prod/g").status_code == 403  # the other token's group does not lend its prefix
    assert stage(as_users, "/atlas/user/g").status_code == 201
    assert stage(as_prod, "/atlas/prod/h").status_code == 201  # and nothing was taken away meanwhile
    user = WlcgIdentity.objects.get(subject="svc").user
    assert set(user.groups.all()) == {prod, users}
    # accounted to the group its own token names
    assert RestoreRequest.objects.get(path="/atlas/prod/f").group == prod
    assert RestoreRequest.objects.get(path="/atlas/user/g").group == users
    # the operator's group for the account wins over the token's
    ops = Group.objects.create(name="ops")
    PathPrefix.objects.create(group=ops, prefix="/atlas/ops")
    Account.objects.update_or_create(user=user, defaults={"group": ops})
    assert stage(as_prod, "/atlas/prod/i").status_code == 201
    assert RestoreRequest.objects.get(path="/atlas/prod/i").group == ops


def test_keys_are_cached_and_an_unknown_kid_does_not_refetch_every_time(issuer):
    assert stage(bearer(issuer.mint(sub="a")), "/atlas/f1").status_code == 201
    assert stage(bearer(issuer.mint(sub="a")), "/atlas/f2").status_code == 201
    assert issuer.fetches == 1
    for _ in range(5):
        assert stage(bearer(issuer.mint(kid="forged")), "/atlas/f3").status_code == 401
    assert issuer.fetches == 1  # within the fetch gap the forged kid asks the issuer nothing more


def test_keys_survive_an_issuer_outage(issuer, settings):
    assert stage(bearer(issuer.mint()), "/atlas/f1").status_code == 201
    issuer.down = True
    settings.CAROUSEL_WLCG_KEYS_REFRESH_S = 0  # due for refresh: the refresh fails, the old set stays
    settings.CAROUSEL_WLCG_FETCH_GAP_S = 0
    cache.delete(wlcg._cache_key(issuer.url) + ":fetching")
    wlcg.refresh_all_keys()
    assert stage(bearer(issuer.mint()), "/atlas/f2").status_code == 201


def test_scheduled_refresh_fetches_only_stale_sets(issuer, settings):
    wlcg.refresh_all_keys()
    assert issuer.fetches == 1
    wlcg.refresh_all_keys()
    assert issuer.fetches == 1
    settings.CAROUSEL_WLCG_KEYS_REFRESH_S = 0
    wlcg.refresh_all_keys()
    assert issuer.fetches == 2


def test_api_tokens_work_with_the_bearer_keyword(alice):
    key = Token.objects.create(user=alice).key
    client = bearer(key)
    assert stage(client, "/d/a").status_code == 201
    assert client.get("/api/v1/summary/").status_code == 200
    assert bearer("not-a-token").get("/api/v1/summary/").status_code == 401


def test_native_on_behalf_of_only_from_service_accounts(alice, bob):
    Account.objects.filter(user=bob).update(acts_for_others=True)
    r = client_for(bob).post("/api/v1/requests/", {"paths": ["/d/a"], "on_behalf_of": "alice"}, format="json")
    assert r.status_code == 201, r.content
    assert RestoreRequest.objects.get().user == alice
    assert Bulk.objects.get().submitter == bob
    r = client_for(alice).post("/api/v1/requests/", {"paths": ["/d/b"], "on_behalf_of": "bob"}, format="json")
    assert r.status_code == 403 and "service account" in r.json()["detail"]
    r = client_for(bob).post("/api/v1/requests/", {"paths": ["/d/c"], "on_behalf_of": "nobody"}, format="json")
    assert r.status_code == 400
    assert RestoreRequest.objects.count() == 1


def test_a_service_account_finds_and_cancels_what_it_asked_for_on_a_persons_behalf(alice, bob, charlie):
    # The XRootD prepare hook finds a request by its label and cancels it as the service account,
    # though the requests belong to the person.
    Account.objects.filter(user=bob).update(acts_for_others=True)
    service = client_for(bob)
    r = service.post("/api/v1/requests/", {"paths": ["/x/1", "/x/2"], "on_behalf_of": "alice", "label": "xrd-7"},
                     format="json")
    assert r.status_code == 201, r.content
    found = service.get("/api/v1/bulks/", {"label": "xrd-7"}).json()["results"]
    assert [b["id"] for b in found] == [str(Bulk.objects.get().id)]
    listed = service.get("/api/v1/requests/", {"bulk": found[0]["id"]}).json()["results"]
    assert sorted(x["path"] for x in listed) == ["/x/1", "/x/2"]
    assert service.post(f"/api/v1/bulks/{found[0]['id']}/cancel/").status_code == 200
    assert set(RestoreRequest.objects.values_list("state", flat=True)) == {"cancelled"}
    # An ordinary account sees none of it.
    assert client_for(charlie).get("/api/v1/bulks/", {"label": "xrd-7"}).json()["results"] == []


@pytest.mark.parametrize("claims", [{"scope": None}, {"scope": "openid profile"},
                                    {"scope": None, "groups": ["/nobody-mapped-this"]}])
def test_a_token_with_no_staging_right_stages_nothing_on_either_door(issuer, claims):
    """No scope, only `openid profile`, or only a group nobody mapped: 403 on both doors (issue 25)."""
    client = bearer(issuer.mint(sub="nobody", **claims))
    assert stage(client, "/atlas/data/f").status_code == 403
    assert client.post("/api/v1/requests/", {"paths": ["/atlas/data/f"]}, format="json").status_code == 403
    assert not RestoreRequest.objects.exists()


def test_a_tokens_scopes_hold_on_the_native_door_for_cancel_and_release(issuer):
    """A token of the same subject scoped to poll elsewhere may not cancel or release through the
    native API, as the Tape REST door already refused it (issue 25)."""
    owner = bearer(issuer.mint(sub="u-1", scope="storage.stage:/data"))
    r = owner.post("/api/v1/requests/", {"paths": ["/atlas/data/a", "/atlas/data/b"]}, format="json")
    assert r.status_code == 201, r.content
    bulk = r.json()["bulk_id"]
    ids = list(RestoreRequest.objects.values_list("id", flat=True))
    elsewhere = bearer(issuer.mint(sub="u-1", scope="storage.poll:/elsewhere"))
    assert elsewhere.post(f"/api/v1/bulks/{bulk}/cancel/").status_code == 403
    assert elsewhere.post("/api/v1/requests/cancel/", {"ids": ids}, format="json").status_code == 403
    assert elsewhere.post(f"/api/v1/requests/{ids[0]}/cancel/").status_code == 403
    assert elsewhere.post("/api/v1/requests/release/", {"paths": ["/atlas/data/a"]},
                          format="json").status_code == 403
    assert set(RestoreRequest.objects.values_list("state", flat=True)) == {"queued"}
    assert owner.post(f"/api/v1/bulks/{bulk}/cancel/").json() == {"cancelled": 2}


# One WLCG token per scope (common JWT profile 1.3), with and without a path that matches, on
# both doors: submit, poll, cancel, release and archiveinfo (issue 25). Paths are under the
# issuer's base path /atlas; the requests acted on are the same subject's, staged beforehand.
# A refusal is 403 with `WWW-Authenticate: Bearer error="insufficient_scope"` on both doors;
# the list forms (release by paths on the native API; a stage request's cancel and release on the
# Tape REST door) skip a path outside the scopes (200, nothing done).
NO = 403
SCOPE_TABLE = {
    # scope: {(door, action): status}
    "openid profile": {},
    "storage.read:/data": {},
    "storage.read:/elsewhere": {},
    "storage.stage:/data": {(door, action): 200 for door in ("api", "tape")
                            for action in ("submit", "poll", "cancel", "release", "archiveinfo")},
    # archiveinfo answers path by path: 200, the path outside the scopes with its own `error`
    "storage.stage:/elsewhere": {("api", "release"): 200, ("tape", "cancel"): 200, ("tape", "release"): 200,
                                 ("tape", "archiveinfo"): 200},
    "storage.poll:/data": {("api", "poll"): 200, ("tape", "poll"): 200, ("tape", "archiveinfo"): 200},
    "storage.poll:/elsewhere": {("tape", "archiveinfo"): 200},
}


def _scoped_calls(client, bulk, req):
    path = req.path
    return {
        ("api", "submit"): lambda: client.post("/api/v1/requests/", {"paths": ["/atlas/data/new"]}, format="json"),
        ("tape", "submit"): lambda: stage(client, "/atlas/data/new2"),
        ("api", "poll"): lambda: client.get(f"/api/v1/requests/{req.pk}/"),
        ("tape", "poll"): lambda: client.get(f"{BASE}/stage/{bulk}"),
        ("api", "cancel"): lambda: client.post(f"/api/v1/requests/{req.pk}/cancel/"),
        ("tape", "cancel"): lambda: client.post(f"{BASE}/stage/{bulk}/cancel", {"paths": [path]}, format="json"),
        ("api", "release"): lambda: client.post("/api/v1/requests/release/", {"paths": [path]}, format="json"),
        ("tape", "release"): lambda: client.post(f"{BASE}/release/{bulk}", {"paths": [path]}, format="json"),
        ("tape", "archiveinfo"): lambda: client.post(f"{BASE}/archiveinfo", {"paths": [path]}, format="json"),
    }


@pytest.mark.parametrize("scope", list(SCOPE_TABLE))
def test_each_scope_on_both_doors(issuer, scope):
    from django.utils import timezone
    from datetime import timedelta

    owner = bearer(issuer.mint(sub="u-9", scope="storage.stage:/"))
    problems = []
    for key in _scoped_calls(None, None, RestoreRequest(path="/x")):
        # A fresh request of the subject for each call: a cancel must not hide a release.
        r = stage(owner, f"/atlas/data/{key[0]}-{key[1]}")
        assert r.status_code == 201, r.content
        bulk = r.json()["requestId"]
        req = RestoreRequest.objects.get(bulk_id=bulk)
        if key[1] == "release":
            now = timezone.now()
            RestoreRequest.objects.filter(pk=req.pk).update(state="done", finished_at=now,
                                                            pin_until=now + timedelta(days=1))
        client = bearer(issuer.mint(sub="u-9", scope=scope))
        response = _scoped_calls(client, bulk, req)[key]()
        wanted = SCOPE_TABLE[scope].get(key, NO)
        got = 200 if response.status_code == 201 else response.status_code
        if key == ("tape", "archiveinfo") and got == 200:
            entry = response.json()[0]
            if ("locality" in entry) != scope.endswith(":/data"):
                problems.append(f"{key}: wanted {'a locality' if scope.endswith(':/data') else 'an error'}, got {entry}")
        if got != wanted:
            problems.append(f"{key}: wanted {wanted}, got {response.status_code} {response.content[:150]!r}")
        elif wanted == NO and 'error="insufficient_scope"' not in response.get("WWW-Authenticate", ""):
            problems.append(f"{key}: 403 without WWW-Authenticate insufficient_scope")
        req.refresh_from_db()
        changed = req.state == "cancelled" or (key[1] == "release" and req.pin_until is None)
        if key[1] in ("cancel", "release") and changed != (wanted == 200 and scope.endswith(":/data")):
            problems.append(f"{key}: the request was {'changed' if changed else 'left'} ({req.state})")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("claims", [{"sub": "u" * 256}, {"sub": "u-1\x00root"}, {"sub": "u-\ud800"},
                                    {"scope": "storage.stage:/a\x00b"}, {"scope": "storage.poll:/data/../x"},
                                    {"scope": "storage.stage:/data/\ud800"}])
def test_tokens_with_unusable_text_are_invalid_on_both_doors(issuer, claims):
    """A subject too long for the identity, or holding a NUL, or a scope whose path the path
    rules refuse, is an invalid token (401 with the reason), not a database error (issue 25)."""
    client = bearer(issuer.mint(**{"sub": "u-1", "scope": "storage.stage:/", **claims}))
    tape = [stage(client, "/atlas/data/f"), client.get(f"{BASE}/stage/some-id")]
    native = [client.post("/api/v1/requests/", {"paths": ["/atlas/data/f"]}, format="json"),
              client.get("/api/v1/requests/"), client.get("/api/v1/bulks/")]
    for response in tape + native:
        assert response.status_code == 401, response.content
        assert "the token is invalid" in response.json()["detail"]
    for response in tape:
        assert response["WWW-Authenticate"] == 'Bearer error="invalid_token"'
    assert not RestoreRequest.objects.exists() and not WlcgIdentity.objects.exists()
