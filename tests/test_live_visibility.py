"""What everyone sees on the live page: operators (view permission) see it all; other users
see the aggregates and their own files, never another user's name or path."""
import pytest

from carousel.loop.cycle import run_cycle
from carousel.models import Control
from carousel.stagers.immediate import ImmediateStager
from tests.test_frontend import located


@pytest.fixture
def library(settings, alice, bob, now):
    settings.CAROUSEL_STAGERS = {**settings.CAROUSEL_STAGERS, "drives": "tests.test_live_visibility.TwoDrives"}
    settings.CAROUSEL_STAGER = "drives"
    Control.objects.update_or_create(id=1, defaults={"files_per_job": 2, "jobs_in_flight": 1})
    located(alice, ["/alice/mine/0", "/alice/mine/1"], now)
    located(bob, ["/bob/secret/0", "/bob/secret/1", "/bob/secret/2"], now)
    run_cycle(now=now)
    # Work still queued for both, whichever files the scheduler sent first: the users' rows.
    located(alice, ["/alice/mine/later"], now)
    located(bob, ["/bob/secret/later"], now)


class TwoDrives(ImmediateStager):
    """Two drives: one reading one of bob's files, one reading one of alice's."""

    def status(self):
        return {"drives": [{"name": "D1", "tape": "IM0001", "activity": "read", "file": "/bob/secret/0"},
                           {"name": "D2", "tape": "IM0002", "activity": "read", "file": "/alice/mine/0"}]}


def fragment(client, user):
    client.force_login(user)
    r = client.get("/live/fragment/")
    assert r.status_code == 200
    # paths wrap after their slashes (<wbr>, the path_breaks filter): read them whole
    return r.content.decode().replace("<wbr>", "")


def test_a_user_sees_aggregates_and_their_own_files_only(client, alice, library):
    html = fragment(client, alice)
    assert "/bob/secret" not in html and ">bob<" not in html
    assert "another user&#x27;s file" in html or "another user's file" in html
    assert "/alice/mine/0" in html  # her own file on a drive
    assert '<td data-label="User">alice</td>' in html  # her own row
    assert "other users are not named" in html
    assert 'data-label="Group">analysis<' in html  # aggregates per group stay


def test_a_staff_account_without_permissions_sees_what_a_user_sees(client, staffer, library):
    html = fragment(client, staffer)
    assert "/bob/secret" not in html and ">bob<" not in html and "/alice/mine" not in html


def test_an_operator_sees_every_user_and_every_file(client, operator, library):
    html = fragment(client, operator)
    assert "/bob/secret/0" in html and '<td data-label="User">bob</td>' in html
    assert "/alice/mine/0" in html and '<td data-label="User">alice</td>' in html


def test_the_last_cycle_error_is_for_operators(client, alice, operator, library, now):
    Control.objects.filter(id=1).update(last_cycle_at=now, last_cycle_error="KeyError: '/bob/secret/9'")
    assert "/bob/secret/9" not in fragment(client, alice)
    assert "/bob/secret/9" in fragment(client, operator)
