"""Destinations: absolute, normalised, no control characters, under a root the operator allows
(to everyone in settings, or to a group in the admin); site commands get them after `--`."""
import sys
from pathlib import Path

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


# A destination is a directory; files go under it by their path or their name.

@pytest.fixture
def root(settings, tmp_path):
    """A destination root on disk, and a directory beside it, outside it."""
    (tmp_path / "root" / "alice").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    settings.CAROUSEL_DESTINATION_ROOTS = [str(tmp_path / "root")]
    return tmp_path / "root"


def test_files_with_one_name_delivered_by_name_are_refused_and_named(as_alice, roots):
    paths = ["/star/run1/a.root", "/star/run1/b.root", "/star/run2/a.root", "/star/run3/a.root"]
    r = as_alice.post(URL, {"paths": paths, "destination": "/scratch/alice", "destination_layout": "name"},
                      format="json")
    assert r.status_code == 400, r.content
    body = r.json()
    assert "nothing was stored" in body["detail"] and "/scratch/alice" in body["detail"]
    assert [(e["line"], e["path"]) for e in body["errors"]] == [(3, "/star/run2/a.root"), (4, "/star/run3/a.root")]
    assert all("/scratch/alice/a.root" in e["message"] and "/star/run1/a.root" in e["message"]
               for e in body["errors"])
    assert nothing_stored()
    # By their whole path (the default) the same files are fine.
    r = as_alice.post(URL, {"paths": paths, "destination": "/scratch/alice"}, format="json")
    assert r.status_code == 201, r.content
    assert set(RestoreRequest.objects.values_list("destination_layout", flat=True)) == {"path"}


def test_a_file_where_another_needs_a_directory_is_refused_and_both_named(as_alice, roots):
    # By their whole path, /x/a is a file where /x/a/b needs a directory: one would fail at delivery.
    r = as_alice.post(URL, {"paths": ["/x/a/b", "/y/c", "/x/a"], "destination": "/scratch/alice",
                            "destination_layout": "path"}, format="json")
    assert r.status_code == 400, r.content
    body = r.json()
    assert "nothing was stored" in body["detail"]
    (error,) = body["errors"]
    assert error["path"] == "/x/a/b" and error["line"] == 1
    assert "/scratch/alice/x/a/b" in error["message"] and "where /x/a is delivered" in error["message"]
    assert nothing_stored()


def test_a_parent_target_is_flagged_for_both_layouts():
    from carousel.domain.paths import target_collisions

    by_path = target_collisions(["/x/a", "/y/b", "/x/a/b/c"], destination="/d", layout="path")
    assert [(e.index, e.path) for e in by_path] == [(2, "/x/a/b/c")]
    assert "/x/a" in by_path[0].message and "/d/x/a/b/c" in by_path[0].message
    # By name, targets hold no slash below the destination: only one name twice can meet.
    assert target_collisions(["/x/a", "/y/b"], destination="/d/", layout="name") == []
    assert target_collisions(["/x/a", "/x/a/b"], destination="/d", layout="path")[0].index == 1


def test_the_web_form_refuses_files_with_one_name_delivered_by_name(client, alice, roots):
    client.force_login(alice)
    r = client.post("/restore/", {"paths": "/star/run1/a.root\n\n/star/run2/a.root", "destination": "/scratch/alice",
                                  "destination_layout": "name"})
    assert r.status_code == 400
    page = r.content.decode()
    assert "nothing was stored" in page and "<td data-label=\"Line\">3</td>" in page and "/star/run2/a.root" in page
    assert nothing_stored()
    assert "by its name alone" in client.get("/restore/").content.decode()


def test_the_layout_is_kept_through_the_intake(settings, alice, now, roots):
    settings.CAROUSEL_INTAKE_ABOVE = 1
    result = restore_submit(user=alice, now=now, paths=["/star/a", "/star/b"], destination="/scratch/alice",
                            destination_layout="name")
    assert result.bulk.pending == 2
    from carousel.domain import intake
    intake.settle(result.bulk.pk)
    assert list(RestoreRequest.objects.values_list("destination_layout", flat=True)) == ["name", "name"]


def test_an_unknown_layout_is_a_400(as_alice, roots):
    r = as_alice.post(URL, {"paths": ["/a"], "destination": "/scratch/a", "destination_layout": "flat"},
                      format="json")
    assert r.status_code == 400 and "destination_layout" in r.json()["fields"]
    assert nothing_stored()


def test_the_api_schema_says_what_a_destination_is(as_alice):
    schema = as_alice.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    fields = schema["components"]["schemas"]["Submit"]["properties"]
    assert "directory" in fields["destination"]["description"]
    assert "destination_layout" in fields and "refused" in fields["destination_layout"]["description"]


def test_the_command_line_asks_for_a_layout(capsys):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "client"))
    from carousel_client import cli

    sent = {}

    class Client:
        def submit(self, paths, **options):
            sent.update(options, paths=paths)
            return {"bulk_id": "b1", "files": 1, "created": 1, "existing": 0, "shared": 0, "url": ""}

    parser = cli.build_parser()
    args = parser.parse_args(["submit", "--destination", "/scratch/alice", "--destination-layout", "name", "/a"])
    args.json = True
    cli.COMMANDS["submit"](Client(), args)
    assert sent["destination_layout"] == "name" and sent["paths"] == ["/a"]
    with pytest.raises(SystemExit):
        parser.parse_args(["submit", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "a directory to copy the restored files under" in shown and "are refused" in shown


# Symbolic links below a root, at submission.

def test_a_destination_through_a_link_out_of_its_root_is_refused(as_alice, root, tmp_path):
    (root / "alice" / "link").symlink_to(tmp_path / "outside", target_is_directory=True)
    r = as_alice.post(URL, {"paths": ["/a"], "destination": str(root / "alice" / "link" / "config")},
                      format="json")
    assert r.status_code == 403, r.content
    assert "symbolic link" in r.json()["detail"]
    assert nothing_stored()


def test_a_link_that_stays_inside_its_root_is_resolved(alice, now, root):
    (root / "alice" / "run5").mkdir()
    (root / "alice" / "current").symlink_to(root / "alice" / "run5", target_is_directory=True)
    restore_submit(user=alice, now=now, paths=["/a"], destination=str(root / "alice" / "current" / "out"))
    assert RestoreRequest.objects.get().destination == str(root / "alice" / "run5" / "out")
