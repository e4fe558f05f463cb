"""Details every page gets right: the admin's names for things match the pages', error pages keep
the site's frame and a way back, the cancel button shows only when it can act, paths wrap at
their slashes."""
import re

import pytest
from django.test import RequestFactory
from django.views.defaults import server_error

from carousel.domain.services import restore_submit
from carousel.models import Bulk, RestoreRequest
from frontend.templatetags.carousel_ui import path_breaks


@pytest.fixture
def as_alice_web(client, alice):
    client.force_login(alice)
    return client


def test_the_admin_says_submissions(client, operator, alice, now):
    operator.is_superuser = True
    operator.save()
    client.force_login(operator)
    restore_submit(user=alice, now=now, paths=["/a/1"])
    assert Bulk._meta.verbose_name_plural == "submissions"
    for url in ("/admin/", "/admin/carousel/bulk/"):  # the admin's URLs stay
        page = client.get(url).content.decode()
        assert "Submissions" in page and "Bulks" not in page, url


def test_a_missing_page_has_the_sites_frame_and_a_way_back(as_alice_web, settings):
    settings.DEBUG = False
    r = as_alice_web.get("/no/such/page/")
    page = r.content.decode()
    assert r.status_code == 404
    assert 'class="top"' in page and "My requests" in page  # the frame, its navigation
    assert "Page not found" in page and "/no/such/page/" in page
    assert 'href="/">Back to my requests</a>' in page


def test_a_server_error_page_has_the_sites_frame_and_a_way_back(db, settings):
    settings.DEBUG = False
    r = server_error(RequestFactory().get("/broken/"))
    page = r.content.decode()
    assert r.status_code == 500
    assert 'class="top"' in page and "Carousel" in page
    assert 'href="/">Back to my requests</a>' in page


def test_cancel_selected_shows_only_when_something_can_be_cancelled(as_alice_web, alice, now):
    restore_submit(user=alice, now=now, paths=["/a/1", "/a/2"])
    assert "Cancel selected" in as_alice_web.get("/").content.decode()
    RestoreRequest.objects.update(state="done", finished_at=now)
    page = as_alice_web.get("/").content.decode()
    assert "/<wbr>a/<wbr>1" in page and "Cancel selected" not in page


def test_paths_wrap_after_their_slashes_not_inside_names(as_alice_web, alice, now):
    path = "/atlas/data23_13p6TeV/AOD.36372929._000123.pool.root.1"
    restore_submit(user=alice, now=now, paths=[path])
    page = as_alice_web.get("/").content.decode()
    shown = re.search(r'<span title="([^"]+)">(.*?)</span>', page)
    assert shown.group(1) == path
    assert shown.group(2) == "/<wbr>atlas/<wbr>data23_13p6TeV/<wbr>AOD.36372929._000123.pool.root.1"
    assert str(path_breaks("/a&b/<c>")) == "/<wbr>a&amp;b/<wbr>&lt;c&gt;"  # still escaped
