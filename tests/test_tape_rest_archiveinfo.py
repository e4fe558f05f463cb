"""archiveinfo (issue 25): bounded, authorised path by path as polling, and never a web worker
held on the stager: paths never located get at most ARCHIVEINFO_WAIT_S of the stager for the
whole call; what it does not answer in time is left to the loop (WantedLocation)."""
import threading
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group

from carousel.grid import door as grid
from carousel.infra import plugins
from carousel.loop.locating import locate_new_work, locate_wanted
from carousel.models import Control, FileLocation, PathPrefix, Tape, WantedLocation, path_key
from carousel.stagers.base import LocateError, Location
from tests.test_wlcg_tokens import bearer, issuer  # noqa: F401 (a fixture)

BASE = "/api/tape-rest/v1"
pytestmark = pytest.mark.django_db


class Counting:
    """Answers at once: a location under /on-tape/, "no such file" under /gone/, "try later"
    under /busy/."""

    def __init__(self):
        self.calls = []

    def locate(self, paths):
        self.calls.append(list(paths))
        out = []
        for p in paths:
            if p.startswith("/gone/"):
                out.append(LocateError(p, "permanent", "no such file"))
            elif p.startswith("/busy/"):
                out.append(LocateError(p, "transient", "try later"))
            else:
                out.append(Location(p, "T7", 3, 10))
        return out


class Hanging(Counting):
    """Answers only once the test lets it."""

    def __init__(self):
        super().__init__()
        self.go = threading.Event()

    def locate(self, paths):
        self.go.wait(30)
        return super().locate(paths)


def finish(stager):
    """Let a hanging stager answer and wait until archiveinfo's thread is done with it."""
    stager.go.set()
    assert grid._asking.acquire(timeout=30)
    grid._asking.release()


def one_of_each(answer):
    assert all(len({"locality", "error"} & set(entry)) == 1 for entry in answer), answer
    return answer


@pytest.fixture
def stager(settings):
    settings.CAROUSEL_STAGERS = {**settings.CAROUSEL_STAGERS, "counting": "tests.test_tape_rest_archiveinfo.Counting"}
    settings.CAROUSEL_STAGER = "counting"
    return plugins.stager()


def test_more_paths_than_a_stage_request_may_hold_is_413_and_nothing_asked(as_alice, stager, settings):
    settings.CAROUSEL_TAPE_REST_MAX_FILES = 2
    r = as_alice.post(f"{BASE}/archiveinfo", {"paths": ["/a/1", "/a/2", "/a/3"]}, format="json")
    assert r.status_code == 413 and r["Content-Type"].startswith("application/problem+json")
    assert "limit is 2" in r.json()["detail"]
    assert stager.calls == []
    assert as_alice.post(f"{BASE}/archiveinfo", {"paths": ["/a/1", "/a/2"]}, format="json").status_code == 200


def test_a_path_answered_in_time_gets_its_locality_and_its_location_is_recorded(now):
    stager = Counting()
    answer = one_of_each(grid.archive_info(paths=["/on-tape/a", "/gone/b"], now=now, stager=stager))
    assert answer == [{"path": "/on-tape/a", "locality": "TAPE"}, {"path": "/gone/b", "error": "no such file"}]
    assert FileLocation.objects.get(path_key=path_key("/on-tape/a")).tape.label == "T7"
    assert not WantedLocation.objects.exists()


def test_a_path_not_answered_in_time_is_not_known_yet_and_left_to_the_loop(now):
    stager = Hanging()
    try:
        answer = one_of_each(grid.archive_info(paths=["/on-tape/a"], now=now, stager=stager, wait_s=0.01))
    finally:
        finish(stager)
    assert answer == [{"path": "/on-tape/a", "error": grid.NOT_KNOWN_YET}]
    # The late answer is not taken: the loop asks again, and records what it learns.
    assert not FileLocation.objects.exists()
    assert list(WantedLocation.objects.values_list("path", flat=True)) == ["/on-tape/a"]
    loop_stager = Counting()
    locate_new_work(now=now, stager=loop_stager, control=Control.get())
    assert loop_stager.calls == [["/on-tape/a"]]
    assert not WantedLocation.objects.exists()
    again = Counting()
    assert grid.archive_info(paths=["/on-tape/a"], now=now, stager=again) == [
        {"path": "/on-tape/a", "locality": "TAPE"}]
    assert again.calls == []


def test_one_stager_question_at_a_time_per_process(now):
    stager = Hanging()
    try:
        grid.archive_info(paths=["/on-tape/a"], now=now, stager=stager, wait_s=0.01)
        other = Counting()
        answer = grid.archive_info(paths=["/on-tape/b"], now=now, stager=other, wait_s=0.01)
        assert other.calls == []  # the first question is still out: this one is not asked at all
        assert answer == [{"path": "/on-tape/b", "error": grid.NOT_KNOWN_YET}]
    finally:
        finish(stager)
    assert set(WantedLocation.objects.values_list("path", flat=True)) == {"/on-tape/a", "/on-tape/b"}


def test_a_stager_that_fails_or_says_try_later_leaves_the_path_to_the_loop(now):
    class Down:
        def locate(self, paths):
            raise OSError("hsi: connection refused")

    assert grid.archive_info(paths=["/on-tape/a"], now=now, stager=Down()) == [
        {"path": "/on-tape/a", "error": grid.NOT_KNOWN_YET}]
    assert grid.archive_info(paths=["/busy/b"], now=now, stager=Counting()) == [
        {"path": "/busy/b", "error": grid.NOT_KNOWN_YET}]
    assert set(WantedLocation.objects.values_list("path", flat=True)) == {"/on-tape/a", "/busy/b"}


def test_the_loop_keeps_asking_for_what_the_stager_cannot_tell_yet_for_a_day(now):
    for path in ("/busy/b", "/gone/c", "/on-tape/d"):
        WantedLocation.objects.create(path=path, path_key=path_key(path), wanted_at=now)
    locate_wanted(now=now, stager=Counting(), limit=10)
    # Found, or answered for good: no longer wanted. "Try later": to the back of the line.
    (busy,) = WantedLocation.objects.all()
    assert busy.path == "/busy/b" and busy.asked_at == now
    assert FileLocation.objects.filter(path_key=path_key("/on-tape/d")).exists()
    WantedLocation.objects.create(path="/on-tape/e", path_key=path_key("/on-tape/e"), wanted_at=now)
    first = Counting()
    locate_wanted(now=now, stager=first, limit=1)
    assert first.calls == [["/on-tape/e"]]  # never asked goes before asked already
    later = Counting()
    locate_wanted(now=now + timedelta(days=1, seconds=1), stager=later, limit=10)
    assert later.calls == [] and not WantedLocation.objects.exists()


def test_every_entry_has_a_locality_or_an_error(now, as_alice):
    tape = Tape.objects.create(label="T1")
    FileLocation.objects.create(path="/k/one", path_key=path_key("/k/one"), tape=tape, position=0, size=1,
                                located_at=now)
    answer = grid.archive_info(paths=["/k/one", "/on-tape/x", "/gone/y", "/busy/z", "relative", "/k//one"],
                               now=now, stager=Counting())
    one_of_each(answer)
    assert [e.get("locality") for e in answer] == ["TAPE", "TAPE", None, None, None, "TAPE"]


def test_paths_outside_the_users_groups_prefixes_get_their_own_error(as_alice, stager, settings):
    """The path plugin decides what an API-token user may ask about, path by path (issue 25: it
    let API-token users probe paths outside their group's prefixes)."""
    settings.CAROUSEL_PATH_AUTHORIZATION = "group-prefixes"
    PathPrefix.objects.create(group=Group.objects.get(name="analysis"), prefix="/star/analysis")
    r = as_alice.post(f"{BASE}/archiveinfo", {"paths": ["/star/analysis/a", "/star/production/b"]}, format="json")
    assert r.status_code == 200, r.content
    mine, theirs = one_of_each(r.json())
    assert mine == {"path": "/star/analysis/a", "locality": "TAPE"}
    assert theirs["path"] == "/star/production/b" and "prefix" in theirs["error"]
    assert plugins.stager().calls == [["/star/analysis/a"]]  # the refused path is not even looked up


@pytest.mark.parametrize("scope", ["storage.poll:/data", "storage.stage:/data"])
def test_a_token_gets_localities_where_it_may_poll_and_errors_elsewhere(issuer, stager, scope):  # noqa: F811
    client = bearer(issuer.mint(sub="fts", scope=scope))
    r = client.post(f"{BASE}/archiveinfo/", {"paths": ["/atlas/data/f", "/atlas/mc/g"]}, format="json")
    assert r.status_code == 200, r.content
    data, mc = one_of_each(r.json())
    assert data == {"path": "/atlas/data/f", "locality": "TAPE"}
    assert mc["path"] == "/atlas/mc/g" and "scope" in mc["error"]
    assert stager.calls == [["/atlas/data/f"]]


def test_a_read_scope_polls_nothing(issuer, stager):  # noqa: F811
    # storage.read allows polling on no path at all: refused whole, as on every door (issue 25)
    client = bearer(issuer.mint(sub="fts", scope="storage.read:/"))
    r = client.post(f"{BASE}/archiveinfo", {"paths": ["/atlas/data/f"]}, format="json")
    assert r.status_code == 403
    assert 'error="insufficient_scope"' in r["WWW-Authenticate"] and stager.calls == []
