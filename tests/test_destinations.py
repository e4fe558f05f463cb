"""Destinations: absolute, normalised, no control characters, under a root the operator allows
(to everyone in settings, or to a group in the admin); site commands get them after `--`."""
import sys

import pytest
from django.contrib.auth.models import Group

from carousel.loop.delivery import SiteCommand
from carousel.domain.exceptions import CarouselError
from carousel.models import Bulk, PathPrefix, RestoreRequest
from carousel.domain.services import restore_submit

URL = "/api/v1/requests/"


def nothing_stored():
    return RestoreRequest.objects.count() == 0 and Bulk.objects.count() == 0


@pytest.fixture
def roots(settings):
    settings.CAROUSEL_DESTINATION_ROOTS = ["/scratch"]


@pytest.mark.parametrize("destination,message", [
    ("../../etc/passwd", "not an absolute path"),
    ("-rf", "not an absolute path"),
    ("relative/dir", "not an absolute path"),
    ("--output=/etc/shadow", "not an absolute path"),
    ("/scratch/a\nb", "control character"),
    ("/scratch/a\x00b", "Null characters"),
    ("/scratch/../etc/passwd", "'..' component"),
    ("/scratch/./x", "'.' component"),
])
def test_a_malformed_destination_is_a_400_and_nothing_is_stored(as_alice, roots, destination, message):
    r = as_alice.post(URL, {"paths": ["/a"], "destination": destination}, format="json")
    assert r.status_code == 400, r.content
    assert message in r.json()["fields"]["destination"][0]
    assert nothing_stored()


@pytest.mark.parametrize("destination", ["/etc/passwd", "/scratch2/x", "/", "/scratc"])
def test_a_destination_outside_the_roots_is_a_403_and_nothing_is_stored(as_alice, roots, destination):
    r = as_alice.post(URL, {"paths": ["/a"], "destination": destination}, format="json")
    assert r.status_code == 403, r.content
    body = r.json()
    assert body["code"] == "permission_denied" and "not under a destination root" in body["detail"]
    assert nothing_stored()


def test_the_service_refuses_it_for_every_door(alice, now, roots):
    with pytest.raises(CarouselError) as refused:
        restore_submit(user=alice, now=now, paths=["/a"], destination="/etc/cron.d/x")
    assert refused.value.status == 403
    with pytest.raises(CarouselError) as malformed:
        restore_submit(user=alice, now=now, paths=["/a"], destination="-rf")
    assert malformed.value.status == 400
    assert nothing_stored()


def test_a_destination_under_a_root_is_kept_normalised(as_alice, roots):
    r = as_alice.post(URL, {"paths": ["/a"], "destination": "/scratch//alice/out/"}, format="json")
    assert r.status_code == 201, r.content
    assert RestoreRequest.objects.get().destination == "/scratch/alice/out"


def test_without_any_root_no_destination_is_accepted_but_none_is_fine(as_alice):
    r = as_alice.post(URL, {"paths": ["/a"], "destination": "/scratch/x"}, format="json")
    assert r.status_code == 403 and "no destination root" in r.json()["detail"]
    assert as_alice.post(URL, {"paths": ["/a"], "destination": ""}, format="json").status_code == 201
    assert as_alice.post(URL, {"paths": ["/b"]}, format="json").status_code == 201


def test_a_group_root_from_the_admin_applies_to_its_members_only(alice, charlie, now):
    PathPrefix.objects.create(group=Group.objects.get(name="analysis"), prefix="/gpfs/analysis/",
                              purpose=PathPrefix.Purpose.DESTINATION)
    # A restore prefix is not a destination root.
    PathPrefix.objects.create(group=Group.objects.get(name="production"), prefix="/gpfs/production",
                              purpose=PathPrefix.Purpose.RESTORE)
    restore_submit(user=alice, now=now, paths=["/a"], destination="/gpfs/analysis/alice")
    with pytest.raises(CarouselError, match="not under a destination root"):
        restore_submit(user=alice, now=now, paths=["/b"], destination="/gpfs/analysis2/alice")
    for destination in ("/gpfs/analysis/charlie", "/gpfs/production/charlie"):
        with pytest.raises(CarouselError):
            restore_submit(user=charlie, now=now, paths=["/c"], destination=destination)


def test_an_operator_adds_a_group_root_in_the_admin(client, operator, alice):
    operator.is_superuser = True
    operator.save()
    client.force_login(operator)
    group = Group.objects.get(name="analysis")
    page = client.get(f"/admin/auth/group/{group.pk}/change/")
    assert page.status_code == 200 and b"path prefixes" in page.content.lower()
    r = client.post("/admin/carousel/pathprefix/add/", {"group": group.pk, "prefix": "/gpfs//analysis/",
                                                        "purpose": "destination"})
    assert r.status_code == 302, r.content[:2000]
    assert PathPrefix.objects.get().prefix == "/gpfs/analysis"
    r = client.post("/admin/carousel/pathprefix/add/", {"group": group.pk, "prefix": "gpfs", "purpose": "restore"})
    assert r.status_code == 200 and b"not an absolute path" in r.content


def test_the_web_form_refuses_a_destination_outside_the_roots(client, alice, roots):
    client.force_login(alice)
    r = client.post("/restore/", {"paths": "/a", "destination": "/etc/passwd"})
    assert r.status_code == 403 and "not under a destination root" in r.content.decode()
    assert nothing_stored()


def test_a_site_command_gets_the_paths_after_a_double_dash(tmp_path):
    record = tmp_path / "argv"
    script = tmp_path / "deliver.py"
    script.write_text(f"import sys\nopen({str(record)!r}, 'w').write(repr(sys.argv[1:]))\n")
    SiteCommand([sys.executable, str(script), "--verbose"]).deliver("/stager/disk/f1", "/scratch/alice/f1")
    assert record.read_text() == repr(["--verbose", "--", "/stager/disk/f1", "/scratch/alice/f1"])
