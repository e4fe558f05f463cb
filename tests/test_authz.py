"""Path authorisation: a plugin named in settings decides who may restore what; the shipped
one grants groups path prefixes (whole components). Every door goes through restore_submit."""
import pytest
from django.contrib.auth.models import Group

from carousel.domain.authz import PathAuthorization, paths_refused
from carousel.domain.exceptions import NotAllowed
from carousel.models import Bulk, PathPrefix, RestoreRequest
from carousel.domain.services import restore_submit
from tests.conftest import client_for

URL = "/api/v1/requests/"


class OnlyUnderAlice(PathAuthorization):
    """A site's own rule, named by its dotted path."""

    def refused(self, *, user, paths, action):
        return [(i, p, "only /alice/") for i, p in enumerate(paths) if not p.startswith("/alice/")]


def nothing_stored():
    return RestoreRequest.objects.count() == 0 and Bulk.objects.count() == 0


@pytest.fixture
def by_group(settings, alice, charlie):
    settings.CAROUSEL_PATH_AUTHORIZATION = "group-prefixes"
    PathPrefix.objects.create(group=Group.objects.get(name="analysis"), prefix="/star/analysis")
    PathPrefix.objects.create(group=Group.objects.get(name="production"), prefix="/star/")


def test_by_default_anyone_may_restore_anything(as_alice):
    assert as_alice.post(URL, {"paths": ["/anything/at/all"]}, format="json").status_code == 201


def test_group_prefixes_refuse_paths_outside_the_groups_prefixes_listing_them(as_alice, by_group):
    r = as_alice.post(URL, {"paths": ["/star/analysis/a", "/star/analysis2/b", "//star/production/c",
                                      "/star/analysis"]}, format="json")
    assert r.status_code == 403, r.content
    body = r.json()
    assert body["code"] == "permission_denied" and "2 of the 4 paths" in body["detail"]
    assert [(e["line"], e["path"]) for e in body["errors"]] == [(2, "/star/analysis2/b"),
                                                               (3, "/star/production/c")]
    assert all("not under a prefix" in e["message"] for e in body["errors"])
    assert nothing_stored()


def test_group_prefixes_allow_what_the_group_was_granted(as_alice, alice, charlie, now, by_group):
    assert as_alice.post(URL, {"paths": ["/star/analysis/a", "/star/analysis/sub/b"]}, format="json").status_code == 201
    restore_submit(user=charlie, now=now, paths=["/star/analysis/a", "/star/production/c"])
    assert RestoreRequest.objects.count() == 4


def test_a_user_whose_groups_have_no_prefix_may_restore_nothing(bob, now, settings):
    settings.CAROUSEL_PATH_AUTHORIZATION = "group-prefixes"
    with pytest.raises(NotAllowed, match="may not restore 1 of the 1"):
        restore_submit(user=bob, now=now, paths=["/a"])
    assert paths_refused(user=bob, paths=["/a"])[0][2].startswith("none of your groups")


def test_the_web_form_gets_the_same_answer(client, alice, by_group):
    client.force_login(alice)
    r = client.post("/restore/", {"paths": "/star/analysis/a\n\n/elsewhere/b"})
    assert r.status_code == 403
    html = r.content.decode()
    assert "/elsewhere/b" in html and "not under a prefix" in html
    assert nothing_stored()


def test_a_site_plugin_is_named_by_its_dotted_path(as_alice, settings):
    settings.CAROUSEL_PATH_AUTHORIZATION = "tests.test_authz.OnlyUnderAlice"
    assert as_alice.post(URL, {"paths": ["/alice/x"]}, format="json").status_code == 201
    r = as_alice.post(URL, {"paths": ["/alice/y", "/bob/x"]}, format="json")
    assert r.status_code == 403 and r.json()["errors"][0]["path"] == "/bob/x"


def test_a_plugin_name_that_is_not_registered_says_so(alice, settings, now):
    from carousel.infra.plugins import PluginError

    settings.CAROUSEL_PATH_AUTHORIZATION = "nobody-knows"
    with pytest.raises(PluginError, match="CAROUSEL_PATH_AUTHORIZATIONS"):
        restore_submit(user=alice, now=now, paths=["/a"])


def test_an_operators_cancel_path_cancels_their_own_unless_all_users(operator, alice, now, monkeypatch, capsys):
    """`carousel cancel PATH` as an operator leaves alice's request for the path; `--all-users`
    cancels it, with the change permission (issue 25). The CLI drives the API in-process here."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "client"))
    from carousel_client import api as client_api, cli

    restore_submit(user=alice, now=now, paths=["/p/1"])
    restore_submit(user=operator, now=now, paths=["/p/1"])
    http = client_for(operator)
    sent = []

    class InProcess:
        def __init__(self, *args, **kwargs):
            pass

        def post(self, path, body=None):
            sent.append(body)
            r = http.post(f"/api/v1/{path}", body, format="json")
            if r.status_code >= 400:
                raise client_api.ClientError(r.json()["detail"], code=client_api.EXIT_AUTH)
            return r.json()

    monkeypatch.setattr(client_api, "Client", InProcess)
    monkeypatch.setattr(client_api.Config, "load", staticmethod(lambda: None))
    states = lambda: dict(RestoreRequest.objects.values_list("user__username", "state"))  # noqa: E731
    assert cli.main(["cancel", "/p/1"]) == 0
    assert states() == {"alice": "queued", "operator": "cancelled"}
    assert sent[-1] == {"paths": ["/p/1"]}
    assert cli.main(["cancel", "/p/1", "--all-users"]) == 0
    assert states() == {"alice": "cancelled", "operator": "cancelled"}
    assert "cancelled 1 request" in capsys.readouterr().out
    # alice is told who cancelled hers (it said "cancelled by the user"); the operator's own says that
    reasons = dict(RestoreRequest.objects.values_list("user__username", "last_error"))
    assert reasons == {"alice": "cancelled by operator", "operator": "cancelled by the user"}
    # without the change permission, --all-users is refused
    as_alice = client_for(alice)
    r = as_alice.post("/api/v1/requests/cancel/", {"paths": ["/p/1"], "all_users": True}, format="json")
    assert r.status_code == 403


def test_poll_refusals_are_per_path_by_scope_and_by_group_prefix(alice, by_group):
    """What archiveinfo asks path by path: an API token's user is held to its groups' prefixes,
    a WLCG token also to its scopes (issue 25)."""
    from types import SimpleNamespace

    from carousel.domain import policy

    paths = ["/star/analysis/a", "/star/other/b", "/elsewhere/c"]
    assert sorted(policy.poll_refusals(alice, paths)) == [1, 2]
    poll_only = SimpleNamespace(stage=(), poll=("/star/analysis/a",))
    refused = policy.poll_refusals(policy.Identity(user=alice, grant=poll_only),
                                   ["/star/analysis/a", "/star/analysis/b"])
    assert list(refused) == [1] and "scopes" in refused[1]
    assert policy.poll_refusals(policy.Identity(user=alice, grant=SimpleNamespace(stage=(), poll=())), paths).keys() \
        == {0, 1, 2}


def test_another_users_ids_are_answered_as_ids_that_do_not_exist(alice, bob, as_alice, now):
    """A request or submission of another user was answered "no request 371 visible to you", an
    id that does not exist "nothing at ...: no such address": a caller could tell which ids
    exist, and count another user's requests (a probe's finding). The same words for both."""
    from carousel.domain.services import restore_submit
    from carousel.models import RestoreRequest

    bulk = restore_submit(user=bob, paths=["/theirs/a"], now=now).bulk
    theirs = RestoreRequest.objects.get(user=bob).pk
    missing, missing_bulk = theirs + 1000, "0" * 8 + "-0000-4000-8000-" + "0" * 12
    for method, url, absent in [("get", "/api/v1/requests/{}/", missing),
                                ("post", "/api/v1/requests/{}/cancel/", missing),
                                ("get", "/api/v1/bulks/{}/", missing_bulk),
                                ("get", "/api/v1/bulks/{}/summary/", missing_bulk)]:
        key = theirs if "requests" in url else bulk.pk
        answers = [getattr(as_alice, method)(url.format(k)) for k in (key, absent)]
        assert [a.status_code for a in answers] == [404, 404], url
        bodies = [a.json() for a in answers]
        bodies[1]["detail"] = bodies[1]["detail"].replace(str(absent), str(key))
        assert bodies[0] == bodies[1], (url, bodies)
