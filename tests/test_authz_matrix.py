"""The authorisation matrix: ONE table of identity x door x action -> the answer, walked against
a live server on PostgreSQL (one server, a data set a door, a few hundred requests).

The identities: alice (the owner of what is called on: an API token on the APIs, a session on
the pages), alice's WLCG tokens (one subject, `storage.stage:/data`, `storage.poll:/data`,
`storage.read:/data`, no storage scope, `storage.stage:/elsewhere`), bob (another user), a
staff account holding no permission, a viewer (the view permissions), an operator (view and
change), a service account (acting for alice) and nobody. A cell is a status, or (status,
effect): whether the row's effect holds afterwards (the request cancelled, the pin released,
the other user's path shown). NOSCOPE: 403 with `WWW-Authenticate: Bearer error="insufficient_scope"`.
A cell left out does not apply (a WLCG token on the pages). The rules: carousel/domain/policy.py."""
import itertools
from dataclasses import dataclass
from datetime import timedelta
from types import SimpleNamespace
from typing import Callable

import httpx
import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import Permission
from django.core.cache import cache
from django.test import Client
from django.utils import timezone
from rest_framework.authtoken.models import Token

from carousel.domain import services
from carousel.grid import door as grid
from carousel.models import Account, Control, Job, JobState, RequestState, RestoreRequest, Tape, WlcgIdentity
from tests.conftest import grant_operator_permissions, make_user
from tests.fakes.wlcg_issuer import Issuer

AUD = "https://carousel.test"
JWT_SCOPES = {"jwt_stage": "storage.stage:/data", "jwt_poll": "storage.poll:/data", "jwt_read": "storage.read:/data",
              "jwt_none": "openid profile", "jwt_elsewhere": "storage.stage:/elsewhere"}
PEOPLE = ("alice", "bob", "staffer", "viewer", "operator", "service")
WHO = ("alice", *JWT_SCOPES, "bob", "staffer", "viewer", "operator", "service", "nobody")
NOSCOPE = "403 insufficient_scope"
CSRF = "c" * 32
TAPE = "/api/tape-rest/v1"


# --- the table ---------------------------------------------------------------------------------

def api(ok, **cells):
    """Both APIs: what every credential that may call at all gets, then the row's own cells.
    A token without storage.stage or storage.poll may do nothing; nobody is not logged in."""
    base = {who: ok for who in WHO}
    base.update(jwt_read=NOSCOPE, jwt_none=NOSCOPE, nobody=401)
    base.update(cells)
    return base


def pages(ok, **cells):
    """The pages and the admin: sessions only (a WLCG token is no session)."""
    base = {who: ok for who in PEOPLE}
    base["nobody"] = 302
    base.update(cells)
    return base


def admin(ok, **cells):
    """The admin: the view permission to look, the change permission to act; staff alone: 403."""
    return pages(302, **{"staffer": 403, "viewer": ok, "operator": ok, **cells})


def cancelled(t, _response):
    return RestoreRequest.objects.get(pk=t.req.pk).state == RequestState.CANCELLED


def own_request_of_alice_cancelled(t, _response):
    return RestoreRequest.objects.get(pk=t.mine.pk).state == RequestState.CANCELLED


def pin_released(t, _response):
    return RestoreRequest.objects.get(pk=t.req.pk).pin_until is None


def shows(*texts):
    def check(_t, response):
        return all(text in response.text for text in texts)
    return check


# Whose request a row acts on, made fresh for each cell of a row that changes something.
def alices_request(w):
    return w.submit(w.alice, "own")


def alices_pin(w):
    return w.pinned(w.alice)


def pin_the_service_made(w):
    return w.pinned(w.service)


def service_submission(w):
    """A service's submission for alice holding a request it made (req) and alice's own request
    for the same file asked again (mine), alice's own submission of it since cancelled: the
    service's cancel must leave alice's own request (issue 25)."""
    path = w.path("mine")
    mine = w.submit(w.alice, path=path)
    bulk = grid.submission_create(submitter=w.service, on_behalf_of="alice", paths=[w.path("svc"), path],
                                  now=timezone.now()).bulk
    services.bulk_cancel(bulk=mine.bulk, now=timezone.now())  # the service's submission still wants it
    assert RestoreRequest.objects.get(pk=mine.req.pk).state == RequestState.QUEUED
    return SimpleNamespace(bulk=bulk, req=RestoreRequest.objects.get(bulk=bulk), mine=mine.req)


def service_submission_pinned(w):
    """service_submission with both requests restored and pinned: the service's release of its
    stage request must leave alice's own pin (issue 25)."""
    t = service_submission(w)
    now = timezone.now()
    RestoreRequest.objects.filter(pk__in=[t.req.pk, t.mine.pk]).update(
        state=RequestState.DONE, finished_at=now, pin_until=now + timedelta(days=1))
    return t


def own_pin_of_alice_released(t, _response):
    return RestoreRequest.objects.get(pk=t.mine.pk).pin_until is None


def lists_the_submission(t, response):
    return str(t.bulk.pk) in response.text


def quarantined_tape(w):
    return SimpleNamespace(tape=Tape.objects.create(label=f"Q{next(w.n)}", quarantined_at=timezone.now(),
                                                    quarantine_reason="three failures"))


def quarantine_lifted(t, _response):
    return Tape.objects.get(pk=t.tape.pk).quarantined_at is None


def alices_retry(w):
    t = w.submit(w.alice, "retry")
    RestoreRequest.objects.filter(pk=t.req.pk).update(state=RequestState.RETRY,
                                                      retry_at=timezone.now() + timedelta(hours=1))
    return t


def queued_again(t, _response):
    return RestoreRequest.objects.get(pk=t.req.pk).state == RequestState.QUEUED


def a_sent_job(w):
    now = timezone.now()
    return SimpleNamespace(job=Job.objects.create(state=JobState.SENT, created_at=now, sent_at=now))


def job_given_up(t, _response):
    return Job.objects.get(pk=t.job.pk).state == JobState.FAILED


@dataclass
class Row:
    name: str
    door: str  # api, tape, web
    method: str
    url: Callable
    expect: dict
    body: Callable = None
    setup: Callable = None  # a fresh target per cell; None: the shared data set
    effect: Callable = None
    form: bool = False  # a form post (the pages), else JSON
    fails_today: str = ""  # the issue-25 case this row checks (it failed before the policy)


OWNER_READS = dict(bob=404, staffer=404, service=404, jwt_elsewhere=403)
OWNER_ACTS = dict(bob=(404, False), staffer=(404, False), viewer=(403, False), service=(404, False),
                  jwt_poll=(403, False), jwt_elsewhere=(403, False), jwt_read=(NOSCOPE, False),
                  jwt_none=(NOSCOPE, False), nobody=(401, False))
# A list form: what may not be acted on is skipped (200, nothing done); a token that allows the
# action on no path is refused whole.
LIST_SKIPS = dict(bob=(200, False), staffer=(200, False), viewer=(200, False), service=(200, False),
                  jwt_elsewhere=(200, False), jwt_poll=(NOSCOPE, False), jwt_read=(NOSCOPE, False),
                  jwt_none=(NOSCOPE, False), nobody=(401, False))
TAPE_OWN_ONLY = dict(bob=404, staffer=404, viewer=404, operator=404, service=404)
TAPE_ACTS = dict(bob=(404, False), staffer=(404, False), viewer=(404, False), operator=(404, False),
                 service=(404, False), jwt_poll=(403, False), jwt_elsewhere=(403, False),
                 jwt_read=(NOSCOPE, False), jwt_none=(NOSCOPE, False), nobody=(401, False))

TABLE = [
    # The native API.
    Row("list requests: everyone's paths shown", "api", "GET", lambda w, t: "/api/v1/requests/",
        api((200, False), viewer=(200, True), operator=(200, True), jwt_read=(NOSCOPE, False),
            jwt_none=(NOSCOPE, False), nobody=(401, False)), effect=shows("/data/base-", "/data/bob-")),
    Row("submit", "api", "POST", lambda w, t: "/api/v1/requests/",
        api(201, jwt_poll=NOSCOPE, jwt_elsewhere=NOSCOPE), body=lambda w, t: {"paths": [w.path("new")]},
        fails_today="a token with no staging scope stages anything"),
    Row("read alice's request", "api", "GET", lambda w, t: f"/api/v1/requests/{w.base.req.pk}/",
        api(200, **OWNER_READS)),
    Row("cancel alice's request", "api", "POST", lambda w, t: f"/api/v1/requests/{t.req.pk}/cancel/",
        api((200, True), **OWNER_ACTS), setup=alices_request, effect=cancelled),
    Row("cancel-many alice's request by id", "api", "POST", lambda w, t: "/api/v1/requests/cancel/",
        api((200, True), **LIST_SKIPS), body=lambda w, t: {"ids": [t.req.pk]}, setup=alices_request,
        effect=cancelled, fails_today="scopes hold on one door only"),
    Row("cancel-many by path: one's own only", "api", "POST", lambda w, t: "/api/v1/requests/cancel/",
        api((200, True), **LIST_SKIPS, operator=(200, False)), body=lambda w, t: {"paths": [t.req.path]},
        setup=alices_request, effect=cancelled, fails_today="an operator's cancel PATH cancels everyone's"),
    Row("cancel-many by path for all users", "api", "POST", lambda w, t: "/api/v1/requests/cancel/",
        api((403, False), operator=(200, True), jwt_read=(NOSCOPE, False), jwt_none=(NOSCOPE, False),
            jwt_poll=(NOSCOPE, False), nobody=(401, False)),
        body=lambda w, t: {"paths": [t.req.path], "all_users": True}, setup=alices_request, effect=cancelled),
    Row("release alice's pin by path", "api", "POST", lambda w, t: "/api/v1/requests/release/",
        api((200, True), **LIST_SKIPS, operator=(200, False)), body=lambda w, t: {"paths": [t.req.path]},
        setup=alices_pin, effect=pin_released, fails_today="scopes hold on one door only"),
    Row("release the pin a service made for alice", "api", "POST", lambda w, t: "/api/v1/requests/release/",
        api((200, True), **{**LIST_SKIPS, "operator": (200, False), "service": (200, True)}),
        body=lambda w, t: {"paths": [t.req.path]}, setup=pin_the_service_made, effect=pin_released,
        fails_today="a service account cannot release the pins it made for a person"),
    Row("list submissions: alice's shown", "api", "GET", lambda w, t: "/api/v1/bulks/?page_size=1000",
        api((200, True), bob=(200, False), staffer=(200, False), service=(200, False),
            jwt_elsewhere=(200, False), jwt_read=(NOSCOPE, False), jwt_none=(NOSCOPE, False), nobody=(401, False)),
        effect=lists_the_submission, fails_today="submission reads ignore token scopes"),
    Row("read alice's submission", "api", "GET", lambda w, t: f"/api/v1/bulks/{w.base.bulk.pk}/",
        api(200, bob=404, staffer=404, service=404, jwt_elsewhere=NOSCOPE),
        fails_today="submission reads ignore token scopes"),
    Row("cancel alice's submission", "api", "POST", lambda w, t: f"/api/v1/bulks/{t.bulk.pk}/cancel/",
        api((200, True), **{**OWNER_ACTS, "jwt_poll": (NOSCOPE, False), "jwt_elsewhere": (200, False)}),
        setup=alices_request, effect=cancelled, fails_today="scopes hold on one door only"),
    Row("the service cancels its submission holding alice's own request", "api", "POST",
        lambda w, t: f"/api/v1/bulks/{t.bulk.pk}/cancel/",
        api((200, True), **{**OWNER_ACTS, "jwt_poll": (NOSCOPE, False), "jwt_elsewhere": (200, False),
                            "service": (200, False)}),
        setup=service_submission, effect=own_request_of_alice_cancelled,
        fails_today="a service account cancels a person's own requests"),
    Row("cancel alice's own request the service asked for again", "api", "POST",
        lambda w, t: f"/api/v1/requests/{t.mine.pk}/cancel/", api((200, True), **OWNER_ACTS),
        setup=service_submission, effect=own_request_of_alice_cancelled),
    Row("cancel-many alice's own request the service asked for again", "api", "POST",
        lambda w, t: "/api/v1/requests/cancel/", api((200, True), **LIST_SKIPS),
        body=lambda w, t: {"ids": [t.mine.pk]}, setup=service_submission, effect=own_request_of_alice_cancelled),
    Row("summary: nothing active counted", "api", "GET", lambda w, t: "/api/v1/summary/",
        # alice's own active requests are counted; a token of hers scoped to /elsewhere counts
        # none of her /data requests.
        api(200, alice=(200, False), jwt_stage=(200, False), jwt_poll=(200, False), jwt_elsewhere=(200, True)),
        effect=shows('"active":0,'), fails_today="submission reads ignore token scopes"),
    Row("stager: the last cycle error shown", "api", "GET", lambda w, t: "/api/v1/stager/",
        api((200, False), viewer=(200, True), operator=(200, True), jwt_read=(NOSCOPE, False),
            jwt_none=(NOSCOPE, False), nobody=(401, False)), effect=shows("secret-of-bob"),
        fails_today="the stager's last error shown to everyone"),
    Row("usage: everyone's lines shown", "api", "GET", lambda w, t: "/api/v1/usage/?by=user",
        api((200, False), viewer=(200, True), operator=(200, True), jwt_read=(NOSCOPE, False),
            jwt_none=(NOSCOPE, False), nobody=(401, False)), effect=shows('"name":"alice"', '"name":"bob"'),
        fails_today="usage decided by is_staff"),
    Row("usage csv", "api", "GET", lambda w, t: "/api/v1/usage/csv/", api(200)),
    Row("unknown API address", "api", "GET", lambda w, t: "/api/v1/requests/abc/",
        api(404, jwt_read=404, jwt_none=404, nobody=404)),
    Row("schema", "api", "GET", lambda w, t: "/api/schema/", {"alice": 200, "nobody": 200}),
    Row("API docs", "api", "GET", lambda w, t: "/api/docs/", {"alice": 200, "nobody": 200}),
    # No user credential opens the metrics (test_the_matrix allows no network): a scraper's
    # network or CAROUSEL_METRICS_TOKEN only.
    Row("metrics", "api", "GET", lambda w, t: "/metrics", {who: 403 for who in WHO}),
    # The Tape REST door: a caller's own stage requests (a service's: those it made).
    Row("tape: stage", "tape", "POST", lambda w, t: f"{TAPE}/stage",
        api(201, jwt_poll=NOSCOPE, jwt_elsewhere=NOSCOPE), body=lambda w, t: {"files": [{"path": w.path("t")}]},
        fails_today="a token with no staging scope stages anything"),
    Row("tape: poll alice's stage request", "tape", "GET", lambda w, t: f"{TAPE}/stage/{w.base.bulk.pk}",
        api(200, **TAPE_OWN_ONLY, jwt_elsewhere=NOSCOPE)),
    Row("tape: cancel a file of alice's", "tape", "POST", lambda w, t: f"{TAPE}/stage/{t.bulk.pk}/cancel",
        api((200, True), **{**TAPE_ACTS, "jwt_poll": (NOSCOPE, False), "jwt_elsewhere": (200, False)}),
        body=lambda w, t: {"paths": [t.req.path]}, setup=alices_request, effect=cancelled),
    Row("tape: delete alice's stage request", "tape", "DELETE", lambda w, t: f"{TAPE}/stage/{t.bulk.pk}",
        api((200, True), **{**TAPE_ACTS, "jwt_poll": (NOSCOPE, False), "jwt_elsewhere": (NOSCOPE, False)}),
        setup=alices_request, effect=cancelled),
    Row("tape: release alice's pin", "tape", "POST", lambda w, t: f"{TAPE}/release/{t.bulk.pk}",
        api((200, True), **{**TAPE_ACTS, "jwt_poll": (NOSCOPE, False), "jwt_elsewhere": (200, False)}),
        body=lambda w, t: {"paths": [t.req.path]}, setup=alices_pin, effect=pin_released),
    Row("tape: release by path (gfal2's placeholder id)", "tape", "POST",
        lambda w, t: f"{TAPE}/release/gfal2-placeholder-id",
        api((200, False), alice=(200, True), jwt_stage=(200, True), jwt_poll=(NOSCOPE, False),
            jwt_read=(NOSCOPE, False), jwt_none=(NOSCOPE, False), nobody=(401, False)),
        body=lambda w, t: {"paths": [t.req.path]}, setup=alices_pin, effect=pin_released),
    Row("tape: release by path, one path outside the token's scopes: skipped", "tape", "POST",
        lambda w, t: f"{TAPE}/release/gfal2-placeholder-id",
        api((200, False), alice=(200, True), jwt_stage=(200, True), jwt_poll=(NOSCOPE, False),
            jwt_read=(NOSCOPE, False), jwt_none=(NOSCOPE, False), nobody=(401, False)),
        body=lambda w, t: {"paths": [t.req.path, "/elsewhere/x"]}, setup=alices_pin, effect=pin_released,
        fails_today="release by path refused whole for one path outside the scopes (native skips it)"),
    Row("tape: the service deletes its stage request holding alice's own", "tape", "DELETE",
        lambda w, t: f"{TAPE}/stage/{t.bulk.pk}",
        api((200, True), **{**TAPE_ACTS, "jwt_poll": (NOSCOPE, False), "jwt_elsewhere": (NOSCOPE, False),
                            "service": (200, False)}),
        setup=service_submission, effect=own_request_of_alice_cancelled,
        fails_today="a service account cancels a person's own requests (Tape REST door)"),
    Row("tape: the service cancels alice's own file in its stage request", "tape", "POST",
        lambda w, t: f"{TAPE}/stage/{t.bulk.pk}/cancel",
        api((200, True), **{**TAPE_ACTS, "jwt_poll": (NOSCOPE, False), "jwt_elsewhere": (200, False),
                            "service": (200, False)}),
        body=lambda w, t: {"paths": [t.mine.path]}, setup=service_submission, effect=own_request_of_alice_cancelled,
        fails_today="a service account cancels a person's own requests (Tape REST door)"),
    Row("tape: the service releases alice's own pin in its stage request", "tape", "POST",
        lambda w, t: f"{TAPE}/release/{t.bulk.pk}",
        api((200, True), **{**TAPE_ACTS, "jwt_poll": (NOSCOPE, False), "jwt_elsewhere": (200, False),
                            "service": (200, False)}),
        body=lambda w, t: {"paths": [t.mine.path]}, setup=service_submission_pinned, effect=own_pin_of_alice_released,
        fails_today="a service account releases a person's own pin (Tape REST door)"),
    Row("tape: discovery", "tape", "GET", lambda w, t: "/.well-known/wlcg-tape-rest-api", {who: 200 for who in WHO}),
    Row("tape: archiveinfo", "tape", "POST", lambda w, t: f"{TAPE}/archiveinfo",
        # Answered path by path: a path outside the token's scopes gets an `error` entry of its own
        # (test_tape_rest_archiveinfo checks the entries); a token that may poll nothing: 403.
        api(200), body=lambda w, t: {"paths": [w.base.req.path]},
        fails_today="archiveinfo for a token without a storage scope"),
    # The pages.
    Row("my requests page", "web", "GET", lambda w, t: "/", pages(200)),
    Row("login page", "web", "GET", lambda w, t: "/accounts/login/", pages(200, nobody=200)),
    Row("restore form", "web", "GET", lambda w, t: "/restore/", pages(200)),
    Row("submit by the form", "web", "POST", lambda w, t: "/restore/", pages(302),
        body=lambda w, t: {"paths": w.path("form")}, form=True),
    Row("cancel alice's request by the form", "web", "POST", lambda w, t: "/requests/cancel/",
        pages((302, False), alice=(302, True), operator=(302, True), nobody=(302, False)),
        body=lambda w, t: {"ids": [str(t.req.pk)]}, setup=alices_request, effect=cancelled, form=True),
    Row("live page: the last cycle error shown", "web", "GET", lambda w, t: "/live/",
        pages((200, False), viewer=(200, True), operator=(200, True), nobody=(302, False)),
        effect=shows("secret-of-bob")),
    Row("live fragment", "web", "GET", lambda w, t: "/live/fragment/", pages(200, nobody=286)),
    Row("usage page: everyone's lines shown", "web", "GET", lambda w, t: "/usage/?by=user",
        pages((200, False), viewer=(200, True), operator=(200, True), nobody=(302, False)),
        effect=shows(">alice<", ">bob<"), fails_today="usage decided by is_staff"),
    # The admin.
    Row("admin index", "web", "GET", lambda w, t: "/admin/", admin(200, staffer=200)),
    Row("admin requests", "web", "GET", lambda w, t: "/admin/carousel/restorerequest/", admin(200)),
    Row("admin cancel action", "web", "POST", lambda w, t: "/admin/carousel/restorerequest/",
        admin((302, True), **{who: (302, False) for who in ("alice", "bob", "service", "nobody")},
              staffer=(403, False), viewer=(200, False)),
        body=lambda w, t: {"action": "cancel", "_selected_action": [str(t.req.pk)]}, setup=alices_request,
        effect=cancelled, form=True),
    Row("admin retry action", "web", "POST", lambda w, t: "/admin/carousel/restorerequest/",
        admin(302, staffer=403, viewer=200),
        body=lambda w, t: {"action": "retry_now", "_selected_action": [str(t.req.pk)]},
        setup=alices_request, form=True),
    Row("admin jobs", "web", "GET", lambda w, t: "/admin/carousel/job/", admin(200)),
    Row("admin give up a job", "web", "POST", lambda w, t: "/admin/carousel/job/",
        admin((302, True), **{who: (302, False) for who in ("alice", "bob", "service", "nobody")},
              staffer=(403, False), viewer=(200, False)),
        body=lambda w, t: {"action": "give_up", "_selected_action": [str(t.job.pk)]}, setup=a_sent_job,
        effect=job_given_up, form=True),
    Row("admin lift a tape's quarantine", "web", "POST", lambda w, t: "/admin/carousel/tape/",
        admin((302, True), **{who: (302, False) for who in ("alice", "bob", "service", "nobody")},
              staffer=(403, False), viewer=(200, False)),
        body=lambda w, t: {"action": "lift_quarantine", "_selected_action": [str(t.tape.pk)]},
        setup=quarantined_tape, effect=quarantine_lifted, form=True),
    Row("admin retry queue: retry now", "web", "POST", lambda w, t: "/admin/carousel/retryqueue/",
        admin((302, True), **{who: (302, False) for who in ("alice", "bob", "service", "nobody")},
              staffer=(403, False), viewer=(200, False)),
        body=lambda w, t: {"action": "retry_now", "_selected_action": [str(t.req.pk)]},
        setup=alices_retry, effect=queued_again, form=True),
    Row("admin tapes", "web", "GET", lambda w, t: "/admin/carousel/tape/", admin(200)),
    Row("admin control row", "web", "GET", lambda w, t: "/admin/carousel/control/1/change/", admin(200)),
    Row("admin users", "web", "GET", lambda w, t: "/admin/auth/user/", admin(403, viewer=403, operator=403)),
]


# --- the world and the walk ----------------------------------------------------------------------

class World:
    def __init__(self, issuer):
        self.issuer = issuer
        self.n = itertools.count()
        self.alice = make_user("alice", "analysis")
        self.bob = make_user("bob", "analysis")
        self.staffer = make_user("staffer", "production", staff=True)
        self.viewer = make_user("viewer", "production", staff=True)
        self.viewer.user_permissions.add(*Permission.objects.filter(content_type__app_label="carousel",
                                                                    codename__startswith="view_"))
        self.operator = grant_operator_permissions(make_user("operator", "production", staff=True))
        self.service = make_user("service")
        Account.objects.update_or_create(user=self.service, defaults={"acts_for_others": True})
        WlcgIdentity.objects.create(issuer=issuer.url, subject="alice-sub", user=self.alice)
        self.users = {who: getattr(self, who) for who in PEOPLE}
        self.tokens = {who: Token.objects.create(user=u).key for who, u in self.users.items()}
        self.jwts = {who: issuer.mint(sub="alice-sub", scope=scope, aud=AUD) for who, scope in JWT_SCOPES.items()}
        self.sessions = {}
        for who, user in self.users.items():
            client = Client()
            client.force_login(user)
            self.sessions[who] = client.cookies[django_settings.SESSION_COOKIE_NAME].value
        self.base = self.submit(self.alice, "base")
        self.submit(self.bob, "bob")
        Control.get()
        Control.objects.filter(id=1).update(last_cycle_at=timezone.now(),
                                            last_cycle_error="cycle failed on /data/secret-of-bob")

    def path(self, what):
        return f"/data/{what}-{next(self.n)}"

    def submit(self, user, what="", path=None):
        result = services.restore_submit(user=user, now=timezone.now(), paths=[path or self.path(what)])
        return SimpleNamespace(bulk=result.bulk, req=RestoreRequest.objects.get(bulk=result.bulk))

    def pinned(self, submitter):
        now = timezone.now()
        bulk = grid.submission_create(submitter=submitter, on_behalf_of="alice" if submitter != self.alice else None,
                                      paths=[self.path("pin")], now=now, pin_lifetime=timedelta(days=1)).bulk
        RestoreRequest.objects.filter(bulk=bulk).update(state=RequestState.DONE, finished_at=now,
                                                        pin_until=now + timedelta(days=1))
        return SimpleNamespace(bulk=bulk, req=RestoreRequest.objects.get(bulk=bulk))

    def call(self, http, row, who, target):
        headers, cookies = {}, {}
        if row.door == "web":
            if who != "nobody":
                cookies[django_settings.SESSION_COOKIE_NAME] = self.sessions[who]
            cookies["csrftoken"] = CSRF
            headers["X-CSRFToken"] = CSRF
        elif who in self.jwts:
            headers["Authorization"] = f"Bearer {self.jwts[who]}"
        elif who != "nobody":
            headers["Authorization"] = f"{'Bearer' if row.door == 'tape' else 'Token'} {self.tokens[who]}"
        body = row.body(self, target) if row.body else None
        kwargs = {}
        if body is not None and row.form:
            kwargs["data"] = {**body, "csrfmiddlewaretoken": CSRF}
        elif body is not None:
            kwargs["json"] = body
        if cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in cookies.items())
        http.cookies.clear()
        return http.request(row.method, row.url(self, target), headers=headers, **kwargs)


def judge(row, who, want, response, effect):
    """The mismatch of one cell, or None."""
    status, wanted_effect = want if isinstance(want, tuple) else (want, None)
    problems = []
    if status == NOSCOPE:
        if response.status_code != 403 or 'error="insufficient_scope"' not in response.headers.get(
                "WWW-Authenticate", ""):
            problems.append(f"wanted 403 insufficient_scope, got {response.status_code} "
                            f"WWW-Authenticate={response.headers.get('WWW-Authenticate')!r}")
    elif response.status_code != status:
        problems.append(f"wanted {status}, got {response.status_code}")
    if wanted_effect is not None and effect is not wanted_effect:
        problems.append(f"wanted effect {wanted_effect}, got {effect}")
    if problems:
        return f"{row.name} as {who}: {'; '.join(problems)}: {response.text[:200]!r}"
    return None


@pytest.fixture
def issuer(settings):
    cache.clear()
    with Issuer() as iss:
        settings.CAROUSEL_WLCG_ISSUERS = [{"issuer": iss.url, "audiences": [AUD], "base_path": "/", "name": "grid"}]
        yield iss
    cache.clear()


# A test per door, so that pytest-xdist can walk them on different workers (the whole table took
# 45-70 s on one); each door's rows in the table's order, on a data set of their own.
DOORS = ("api", "tape", "web")


@pytest.mark.long(17)
@pytest.mark.parametrize("door", DOORS)
def test_the_matrix(door, live_server, issuer, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.CAROUSEL_TOKEN_CACHE_SECONDS = 0
    settings.CAROUSEL_METRICS_ALLOW, settings.CAROUSEL_METRICS_TOKEN = [], "the-scrapers-own"
    w = World(issuer)
    failures = []
    with httpx.Client(base_url=live_server.url, follow_redirects=False, timeout=30) as http:
        for row in (row for row in TABLE if row.door == door):
            for who in WHO:
                if who not in row.expect:
                    continue
                target = row.setup(w) if row.setup else w.base
                response = w.call(http, row, who, target)
                effect = row.effect(target, response) if row.effect else None
                failure = judge(row, who, row.expect[who], response, effect)
                if failure:
                    failures.append(failure)
    assert not failures, f"{len(failures)} cell(s) of the matrix disagree:\n" + "\n".join(failures)


def test_the_table_covers_every_identity_and_every_door():
    assert {row.door for row in TABLE} == set(DOORS)
    for row in TABLE:
        missing = set(row.expect) - set(WHO)
        assert not missing, (row.name, missing)
