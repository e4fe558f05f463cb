"""The site's tape map: `manage.py load-tape-map`, the locating step's use of it for stagers that
hide their tapes, and the tape-rest stager sending one stage request per tape."""
import gzip
import json
from collections import Counter
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from carousel.domain.services import restore_submit
from carousel.loop.cycle import run_cycle
from carousel.loop.locating import record_locations
from carousel.models import Control, RestoreRequest, Tape, TapeMapEntry
from carousel.stagers.base import Location
from carousel.stagers.immediate import ImmediateStager
from carousel.stagers.tape_rest import TapeRestStager
from carousel.tape import BEYOND_TAPE_END, GB
from policies.order import position_order
from tests.fakes.tape_rest_server import TapeRestServer


def load(tmp_path, text, name="map.csv", *args):
    path = tmp_path / name
    if name.endswith(".gz"):
        with gzip.open(path, "wt") as handle:
            handle.write(text)
    else:
        path.write_text(text)
    call_command("load-tape-map", str(path), *args)


def mapped():
    return {e.path: (e.tape, e.media, e.position, e.size) for e in TapeMapEntry.objects.all()}


# Loading ---------------------------------------------------------------------------------------

def test_it_loads_a_csv_map_with_its_columns_in_any_order(db, tmp_path):
    load(tmp_path, "tape,path,size,media,position,comment\n"
                   "L80001,/star/raw/a,2000,LTO-8,0,x\n"
                   "L80001,/star/raw//b,,,,\n"
                   "\n"
                   "L80002,/star/raw/c,5,LTO-8,7,y\n")
    assert mapped() == {"/star/raw/a": ("L80001", "LTO-8", 0, 2000), "/star/raw/b": ("L80001", "", None, None),
                        "/star/raw/c": ("L80002", "LTO-8", 7, 5)}


def test_it_loads_json_lines_gzipped(db, tmp_path):
    load(tmp_path, '{"path": "/d/a", "tape": "V1", "media": "LTO-9", "position": 10, "size": 3}\n'
                   '{"path": "/d/b", "tape": "V1"}\n', "map.jsonl.gz")
    assert mapped() == {"/d/a": ("V1", "LTO-9", 10, 3), "/d/b": ("V1", "", None, None)}


def test_the_format_is_guessed_from_the_content(db, tmp_path):
    load(tmp_path, '{"path": "/d/a", "tape": "V1"}\n', "listing.txt")
    load(tmp_path, "path,tape\n/d/b,V2\n", "other.txt")
    assert set(mapped()) == {"/d/a", "/d/b"}


def test_a_load_is_incremental_and_can_be_repeated(db, tmp_path):
    load(tmp_path, "path,tape\n/d/a,V1\n/d/b,V1\n")
    load(tmp_path, "path,tape,media\n/d/b,V2,LTO-8\n/d/c,V2,LTO-8\n", "next.csv")
    assert mapped() == {"/d/a": ("V1", "", None, None), "/d/b": ("V2", "LTO-8", None, None),
                        "/d/c": ("V2", "LTO-8", None, None)}
    load(tmp_path, "path,tape,media\n/d/b,V2,LTO-8\n/d/c,V2,LTO-8\n", "next.csv")
    assert TapeMapEntry.objects.count() == 3
    # Later lines come later in the map's order; within a load, the last line of a file wins.
    load(tmp_path, "path,tape\n/d/x,V3\n/d/y,V3\n/d/x,V4\n", "dup.csv")
    order = list(TapeMapEntry.objects.order_by("ordinal").values_list("path", flat=True))
    assert order[-2:] == ["/d/y", "/d/x"] and mapped()["/d/x"][0] == "V4"


@pytest.mark.parametrize("text,message", [
    ("path,tape\n/d/a,V1\n/d/b,V1,extra\n", "line 3: 3 fields where the header names 2"),
    ("path,tape\n/d/a,V1\nrelative,V1\n", "line 3: path 'relative': not an absolute path"),
    ("path,tape\n/d/a,\n", "line 2: tape is missing or empty"),
    ("path,tape,position\n/d/a,V1,-3\n", "line 2: position must be a whole number"),
    ("path,tape,media\n/d/a,V1,LTO-99\n", "line 2: media 'LTO-99' is not a known technology"),
    ("file,volume\n/d/a,V1\n", "line 1: the first line must name the columns"),
    # Found by a probe: a traceback each, or taken without a word.
    ("path,tape,tape\n/d/a,V1,V2\n", "line 1: the header names tape more than once"),
    ("path,tape\n/d/a,V1\n/d/b," + "x" * 140_000 + "\n", "line 3: not CSV: field larger than field limit"),
    ("path,tape,position\n/d/a,V1,\uff11\uff12\n", "line 2: position must be a whole number"),
])
def test_a_bad_csv_line_is_named_and_nothing_is_stored(db, tmp_path, text, message):
    load(tmp_path, "path,tape\n/d/old,V0\n", "before.csv")
    with pytest.raises(CommandError, match="nothing was stored") as failure:
        load(tmp_path, text)
    assert message in str(failure.value)
    assert mapped() == {"/d/old": ("V0", "", None, None)}


def test_bad_json_lines_are_all_counted_and_nothing_is_stored(db, tmp_path):
    lines = ['{"path": "/d/a", "tape": "V1"}', "not json", '["a list"]', '{"path": "/d/c", "tape": "V1", "size": 1.5}']
    with pytest.raises(CommandError) as failure:
        load(tmp_path, "\n".join(lines) + "\n", "map.jsonl")
    text = str(failure.value)
    assert "3 bad lines" in text and "line 2: not JSON" in text and "line 3: expected a JSON object" in text
    assert "line 4: size must be a whole number" in text


def test_json_lines_of_the_wrong_type_are_told_so_in_jsons_words(db, tmp_path):
    """A tape given as a number was "missing or empty", a position of true "not True" (a probe)."""
    lines = ['{"path": "/d/a", "tape": 5}', '{"path": "/d/b", "tape": "V1", "position": true}']
    with pytest.raises(CommandError) as failure:
        load(tmp_path, "\n".join(lines) + "\n", "map.jsonl")
    text = str(failure.value)
    assert "line 1: tape must be a string, not the number 5" in text
    assert "line 2: position must be a whole number of bytes, not true" in text
    assert not TapeMapEntry.objects.exists()


def test_a_byte_order_mark_is_not_part_of_the_header(db, tmp_path):
    """Excel's "CSV UTF-8" begins with one: the header read '\\ufeffpath' and the file was refused."""
    load(tmp_path, "\ufeffpath,tape\n/d/a,V1\n")
    assert mapped() == {"/d/a": ("V1", "", None, None)}


@pytest.mark.parametrize("name,text", [("deep.jsonl", "[" * 100_000 + "\n"), ("deep.json", "[" * 100_000)])
def test_json_nested_too_deeply_is_a_bad_line_not_a_traceback(db, tmp_path, name, text):
    with pytest.raises(CommandError, match="nested too deeply"):
        load(tmp_path, text, name, *(["--format", "cta", "--media", "LTO-8"] if name.endswith(".json") else []))
    assert not TapeMapEntry.objects.exists()


@pytest.mark.parametrize("text", ["", "path,tape\n", "\n\n"])
def test_an_empty_map_is_said_and_not_taken_as_success(db, tmp_path, text):
    """An export that failed leaves an empty file: it exited 0 with "0 lines, 0 files mapped"."""
    with pytest.raises(CommandError, match="no map lines in it; nothing was loaded"):
        load(tmp_path, text)


def test_an_unreadable_file_is_a_clear_error(db, tmp_path):
    with pytest.raises(CommandError, match="cannot read"):
        call_command("load-tape-map", str(tmp_path / "nothing.csv"))
    (tmp_path / "bad.csv").write_bytes(b"path,tape\n/d/\xff,V1\n")
    with pytest.raises(CommandError, match="nothing was stored"):
        call_command("load-tape-map", str(tmp_path / "bad.csv"))


def test_it_converts_ctas_tapefile_listing_in_fseq_order(db, tmp_path):
    items = [{"af": {"archiveId": "7", "size": "300"}, "df": {"diskInstance": "eos", "path": f"/eos/f{seq}"},
              "tf": {"vid": "V01007", "copyNb": 1, "fSeq": str(seq), "blockId": str(seq * 10)}} for seq in (3, 1, 2)]
    load(tmp_path, json.dumps(items), "ls.json", "--format", "cta", "--media", "LTO-8")
    assert mapped()["/eos/f1"] == ("V01007", "LTO-8", None, 300)
    order = list(TapeMapEntry.objects.order_by("ordinal").values_list("path", flat=True))
    assert order == ["/eos/f1", "/eos/f2", "/eos/f3"]


def test_it_converts_a_dcache_namespace_dump_of_enstore_uris(db, tmp_path):
    uri = "enstore://enstore/?volume={v}&location_cookie=0000_000000000_{c:07d}&size={s}&file_family=raw"
    text = (f"/pnfs/x/b\t{uri.format(v='VOO534', c=9, s=10)}\n"
            f"/pnfs/x/a\t{uri.format(v='VOO534', c=2, s=20)}\n"
            "/pnfs/x/c\tosm://osm/?store=cms&group=raw&bfid=0001\n")
    (tmp_path / "dump.tsv").write_text(text)
    out = tmp_path / "out.txt"
    with out.open("w") as stdout:
        call_command("load-tape-map", str(tmp_path / "dump.tsv"), "--format", "dcache", stdout=stdout)
    assert mapped() == {"/pnfs/x/a": ("VOO534", "", None, 20), "/pnfs/x/b": ("VOO534", "", None, 10)}
    assert list(TapeMapEntry.objects.order_by("ordinal").values_list("path", flat=True)) == ["/pnfs/x/a", "/pnfs/x/b"]
    assert "1 lines named no tape" in out.read_text()


def test_the_map_is_in_the_admin_read_only(client, operator, tmp_path):
    load(tmp_path, "path,tape\n/d/a,V1\n/d/b,V2\n")
    client.force_login(operator)
    page = client.get("/admin/carousel/tapemapentry/", {"q": "V1"}).content.decode()
    assert "/d/a" in page and "/d/b" not in page
    assert client.get("/admin/carousel/tapemapentry/add/").status_code == 403


# Locating ----------------------------------------------------------------------------------------

class HiddenTapes(ImmediateStager):
    """A backend that says a file exists and nothing of its tape (as through Tape REST)."""

    def locate(self, paths):
        return [Location(p, f"rest:{p.rsplit('/', 1)[0]}", 0, 0, tape_known=False) for p in paths]


def test_the_locating_step_places_files_on_the_maps_tapes(alice, now, tmp_path):
    load(tmp_path, "path,tape,media,position,size\n/run/a,V1,LTO-8,500,7\n/run/b,V2,LTO-8,,\n/other/c,V1,,,\n")
    restore_submit(user=alice, now=now, paths=["/run/a", "/run/b", "/other/c", "/run/d"])
    run_cycle(now=now, stager=HiddenTapes())
    where = {r.path: (r.tape.label, r.position, r.size) for r in RestoreRequest.objects.select_related("tape")}
    ordinal = dict(TapeMapEntry.objects.values_list("path", "ordinal"))
    assert where["/run/a"] == ("V1", 500, 7)
    # No position: the map's order, past the tape's end; no size: the stager's.
    assert where["/run/b"] == ("V2", BEYOND_TAPE_END + ordinal["/run/b"], 0)
    assert where["/other/c"][0] == "V1"
    # Not in the map: today's stand-in, the directory.
    assert where["/run/d"] == ("rest:/run", 0, 0)
    media = dict(RestoreRequest.objects.values_list("tape__label", "tape__media"))
    assert media["V1"] == "LTO-8" and media["rest:/run"] == ""


def test_a_map_loaded_later_places_the_next_requests_of_a_located_file(alice, bob, now, tmp_path):
    restore_submit(user=alice, now=now, paths=["/run/a"])
    for step in range(2):
        run_cycle(now=now + timedelta(seconds=10 * step), stager=HiddenTapes())
    assert RestoreRequest.objects.get(user=alice).state == "done"
    load(tmp_path, "path,tape\n/run/a,V1\n")
    later = now + timedelta(seconds=60)
    restore_submit(user=bob, now=later, paths=["/run/a"])
    run_cycle(now=later, stager=HiddenTapes())
    assert RestoreRequest.objects.get(user=bob).tape.label == "V1"
    assert RestoreRequest.objects.get(user=alice).tape.label == "rest:/run"


def test_a_stager_that_knows_the_tape_wins_over_the_map(alice, now, tmp_path):
    load(tmp_path, "path,tape\n/run/a,V9\n")
    restore_submit(user=alice, now=now, paths=["/run/a"])
    run_cycle(now=now, stager=ImmediateStager())
    assert RestoreRequest.objects.get().tape.label != "V9"


# The tape-rest stager with a map --------------------------------------------------------------

def test_tape_rest_sends_one_stage_request_per_tape_and_one_tape_per_drive(alice, now, tmp_path):
    # Three tapes whose files are spread over two directories: by directory (no map), each
    # stage request would mix tapes.
    rows = ["path,tape,media,position,size"]
    paths, positions = {}, {}
    for t in range(3):
        for i in range(4):
            path = f"/star/run{i % 2}/t{t}-f{i}"
            paths[path], positions[path] = f"V{t}", (3 - i) * 100 * GB
            rows.append(f"{path},V{t},LTO-8,{positions[path]},{GB}")
    load(tmp_path, "\n".join(rows) + "\n")
    Control.objects.update_or_create(id=1, defaults={"drives": 2, "files_per_job": 100})
    with TapeRestServer(files=dict.fromkeys(paths, "TAPE")) as server:
        stager = TapeRestStager(url=server.url, timeout_s=5, state_dir=tmp_path / "state")
        try:
            restore_submit(user=alice, now=now, paths=sorted(paths))
            run_cycle(now=now, stager=stager)
            # Two drives to plan for: two tapes sent, the third waits for a drive.
            assert len(server.stage_bodies) == 2
            for step in range(1, 6):
                server.advance()
                server.advance()
                run_cycle(now=now + timedelta(seconds=10 * step), stager=stager)
        finally:
            stager.close()
    assert sorted(RestoreRequest.objects.values_list("state", flat=True)) == ["done"] * 12
    requests = [[f["path"] for f in body["files"]] for body in server.stage_bodies]
    assert len(requests) == 3
    for files in requests:
        assert len({paths[p] for p in files}) == 1
        # In the order of the map's positions: such an endpoint reads a request in position
        # order (MountPlanner.order), so that is the mount the broker plans and estimates.
        assert files == position_order([(p, positions[p], GB) for p in files])
    assert Counter(paths[files[0]] for files in requests) == Counter({"V0": 1, "V1": 1, "V2": 1})


# (A reviewer's finding: the last line of a tape decided its media, and an empty one left it unknown.)
def test_a_tape_takes_its_media_from_any_of_its_map_lines(db, tmp_path, now):
    m = tmp_path / "map.csv"
    m.write_text("path,tape,media\n/star/a,L1,LTO-8\n/star/b,L1,\n")
    call_command("load-tape-map", str(m))
    hidden = [Location(path=p, tape="rest:/star", position=0, size=0, tape_known=False) for p in ("/star/a", "/star/b")]
    record_locations(hidden, now=now)
    assert Tape.objects.get(label="L1").media == "LTO-8"
