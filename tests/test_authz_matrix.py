"""The authorisation matrix: every API call and page, for alice (the owner of the object
called on), bob (another user), a staff account holding no permission, an operator (view and
change permissions on Carousel's models) and nobody (not logged in). Each cell: the status
answered and, for the calls that change something, whether alice's request was cancelled."""
from types import SimpleNamespace

import pytest
from django.test import Client

from carousel.models import Bulk, RestoreRequest
from carousel.domain.services import restore_submit
from tests.conftest import client_for, grant_operator_permissions, make_user

WHO = ["alice", "bob", "staffer", "operator", "nobody"]


@pytest.fixture
def world(db, now, settings):
    # Four accounts per cell: a cheap hasher keeps the matrix's hundred cells fast.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    users = {"alice": make_user("alice", "analysis"), "bob": make_user("bob", "analysis"),
             "staffer": make_user("staffer", "production", staff=True),
             "operator": grant_operator_permissions(make_user("operator", "production", staff=True))}
    restore_submit(user=users["alice"], now=now, paths=["/alice/a"])
    restore_submit(user=users["bob"], now=now, paths=["/bob/b"])
    return SimpleNamespace(users=users, req=RestoreRequest.objects.get(user=users["alice"]).id,
                           bulk=Bulk.objects.get(user=users["alice"]).id)


def api(world, who):
    if who == "nobody":
        from rest_framework.test import APIClient

        return APIClient()
    return client_for(world.users[who])


def web(world, who):
    client = Client()
    if who != "nobody":
        client.force_login(world.users[who])
    return client


# (name, call(world, who) -> response, {who: status} or {who: (status, alice's request cancelled)})
OK = dict.fromkeys(WHO[:4], 200)
OWNER_OR_OPERATOR = {"alice": 200, "bob": 404, "staffer": 404, "operator": 200, "nobody": 401}
CANCELS = {"alice": (200, True), "bob": (404, False), "staffer": (404, False), "operator": (200, True),
           "nobody": (401, False)}
ADMIN_ONLY_OPERATOR = {"alice": 302, "bob": 302, "staffer": 403, "operator": 200, "nobody": 302}
PAGE = {**dict.fromkeys(WHO[:4], 200), "nobody": 302}

MATRIX = [
    # The API.
    ("list requests", lambda w, u: api(w, u).get("/api/v1/requests/"), {**OK, "nobody": 401}),
    ("submit", lambda w, u: api(w, u).post("/api/v1/requests/", {"paths": ["/x"]}, format="json"),
     {**dict.fromkeys(WHO[:4], 201), "nobody": 401}),
    ("read alice's request", lambda w, u: api(w, u).get(f"/api/v1/requests/{w.req}/"), OWNER_OR_OPERATOR),
    ("cancel alice's request", lambda w, u: api(w, u).post(f"/api/v1/requests/{w.req}/cancel/"), CANCELS),
    ("cancel alice's request by id", lambda w, u: api(w, u).post("/api/v1/requests/cancel/", {"ids": [w.req]},
                                                                 format="json"),
     {"alice": (200, True), "bob": (200, False), "staffer": (200, False), "operator": (200, True),
      "nobody": (401, False)}),
    ("list submissions", lambda w, u: api(w, u).get("/api/v1/bulks/"), {**OK, "nobody": 401}),
    ("read alice's submission", lambda w, u: api(w, u).get(f"/api/v1/bulks/{w.bulk}/"), OWNER_OR_OPERATOR),
    ("cancel alice's submission", lambda w, u: api(w, u).post(f"/api/v1/bulks/{w.bulk}/cancel/"), CANCELS),
    ("summary", lambda w, u: api(w, u).get("/api/v1/summary/"), {**OK, "nobody": 401}),
    ("stager", lambda w, u: api(w, u).get("/api/v1/stager/"), {**OK, "nobody": 401}),
    ("schema", lambda w, u: api(w, u).get("/api/schema/"), dict.fromkeys(WHO, 200)),
    ("unknown API address", lambda w, u: api(w, u).get("/api/v1/requests/abc/"), dict.fromkeys(WHO, 404)),
    # The pages.
    ("my requests page", lambda w, u: web(w, u).get("/"), PAGE),
    ("restore form", lambda w, u: web(w, u).get("/restore/"), PAGE),
    ("submit by the form", lambda w, u: web(w, u).post("/restore/", {"paths": "/y"}), dict.fromkeys(WHO, 302)),
    ("cancel alice's request by the form", lambda w, u: web(w, u).post("/requests/cancel/", {"ids": [str(w.req)]}),
     {"alice": (302, True), "bob": (302, False), "staffer": (302, False), "operator": (302, True),
      "nobody": (302, False)}),
    ("live page", lambda w, u: web(w, u).get("/live/"), PAGE),
    ("live fragment", lambda w, u: web(w, u).get("/live/fragment/"), {**OK, "nobody": 286}),
    # The admin.
    ("admin index", lambda w, u: web(w, u).get("/admin/"), {**ADMIN_ONLY_OPERATOR, "staffer": 200}),
    ("admin requests", lambda w, u: web(w, u).get("/admin/carousel/restorerequest/"), ADMIN_ONLY_OPERATOR),
    ("admin cancel action", lambda w, u: web(w, u).post("/admin/carousel/restorerequest/", {
        "action": "cancel", "_selected_action": [w.req]}),
     {"alice": (302, False), "bob": (302, False), "staffer": (403, False), "operator": (302, True),
      "nobody": (302, False)}),
    ("admin control row", lambda w, u: web(w, u).get("/admin/carousel/control/1/change/"), ADMIN_ONLY_OPERATOR),
    ("admin jobs", lambda w, u: web(w, u).get("/admin/carousel/job/"), ADMIN_ONLY_OPERATOR),
    ("admin tapes", lambda w, u: web(w, u).get("/admin/carousel/tape/"), ADMIN_ONLY_OPERATOR),
    ("admin users", lambda w, u: web(w, u).get("/admin/auth/user/"), {**ADMIN_ONLY_OPERATOR, "operator": 403}),
]


@pytest.mark.parametrize("who", WHO)
@pytest.mark.parametrize("name,call,expected", MATRIX, ids=[m[0] for m in MATRIX])
def test_matrix(world, name, call, expected, who):
    from carousel.models import Control

    Control.get()
    want = expected[who]
    status, cancelled = want if isinstance(want, tuple) else (want, None)
    r = call(world, who)
    assert r.status_code == status, f"{name} as {who}: {r.status_code} {r.content[:300]!r}"
    if cancelled is not None:
        state = RestoreRequest.objects.get(id=world.req).state
        assert (state == "cancelled") is cancelled, f"{name} as {who}: alice's request is {state}"


@pytest.mark.parametrize("who,sees", [("alice", {"/alice/a"}), ("bob", {"/bob/b"}), ("staffer", set()),
                                      ("operator", {"/alice/a", "/bob/b"})])
def test_who_sees_which_requests_in_the_list(world, who, sees):
    paths = {r["path"] for r in api(world, who).get("/api/v1/requests/").json()["results"]}
    assert paths == sees
