"""The request list under load: the same answer as DRF's generic rendering, a bounded number
of queries per page, and an index for every filter the API offers."""
import json
import zoneinfo
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from django.test.utils import CaptureQueriesContext
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer

from api.serializers import RequestSerializer, request_list_data, request_list_values
from carousel.domain import selectors
from carousel.loop.cycle import run_cycle
from carousel.models import RestoreRequest
from carousel.domain.services import restore_submit

URL = "/api/v1/requests/"


@pytest.fixture
def varied(alice, bob, now, settings):
    """Requests in several states, located and not, with every optional field set on some."""
    settings.CAROUSEL_DESTINATION_ROOTS = ["/dest"]
    restore_submit(user=alice, paths=["/l/a", "/l/b", "/l/c"], now=now, priority=2, destination="/dest",
                   deadline=now + timedelta(days=1), pin_lifetime=timedelta(hours=3))
    run_cycle(now=now)  # located and sent
    restore_submit(user=alice, paths=["/l/d", "/l/e"], now=now + timedelta(seconds=1))
    restore_submit(user=bob, paths=["/l/a"], now=now + timedelta(seconds=2))
    run_cycle(now=now + timedelta(seconds=10))
    services_cancel = RestoreRequest.objects.filter(path="/l/e")
    from carousel.domain.services import request_cancel
    request_cancel(queryset=services_cancel, now=now + timedelta(seconds=11))
    # One not located yet (bob's /l/a was that one until a joined request took its file's tape).
    restore_submit(user=bob, paths=["/l/f"], now=now + timedelta(seconds=12))
    return list(RestoreRequest.objects.select_related("tape", "user").order_by("id"))


def test_the_list_renders_what_drfs_generic_serializer_renders(varied):
    class Generic(serializers.ModelSerializer):
        user = serializers.CharField(source="user.username", read_only=True)
        tape = serializers.CharField(source="tape.label", read_only=True, default=None)
        disk_path = serializers.SerializerMethodField()
        get_disk_path = RequestSerializer.get_disk_path
        where = serializers.SerializerMethodField()
        get_where = RequestSerializer.get_where
        where_kind = serializers.SerializerMethodField()
        get_where_kind = RequestSerializer.get_where_kind

        class Meta:
            model = RestoreRequest
            fields = RequestSerializer.Meta.fields

    assert {r.state for r in varied} >= {"done", "queued", "cancelled"} or len({r.state for r in varied}) >= 2
    assert any(r.tape_id for r in varied) and any(r.tape_id is None for r in varied)
    assert RequestSerializer(varied, many=True).data == Generic(varied, many=True).data
    # In another time zone too.
    with timezone.override(zoneinfo.ZoneInfo("America/New_York")):
        fast = RequestSerializer(varied, many=True).data
        assert fast == Generic(varied, many=True).data
        assert fast[0]["created_at"].endswith(("-05:00", "-04:00"))


def test_a_page_costs_the_same_queries_however_many_rows(as_alice, alice, now):
    restore_submit(user=alice, paths=[f"/q/{i}" for i in range(3)], now=now)
    as_alice.get(URL)  # the token's look-up is cached from the first request on
    with CaptureQueriesContext(connection) as few:
        assert as_alice.get(URL, {"state": "queued"}).status_code == 200
    restore_submit(user=alice, paths=[f"/q/{i}" for i in range(3, 150)], now=now)
    with CaptureQueriesContext(connection) as many:
        page = as_alice.get(URL, {"state": "queued"}).json()
    assert len(page["results"]) == 100
    assert len(many.captured_queries) == len(few.captured_queries)


COLUMN = {"state": "state", "bulk": "bulk_id", "tape": "tape_id", "since": "created_at", "until": "created_at",
          "path": "path"}


@pytest.mark.parametrize("who,name", [("alice", name) for name in COLUMN if name != "path"]
                         + [("operator", name) for name in COLUMN if name != "state"])
def test_every_filter_of_the_list_has_an_index(name, who, alice, operator, now):
    """With only bitmap scans allowed (enable_seqscan and enable_indexscan off), the plan of
    the list's page (a user's own; and staff's over everyone, except the state filter, which
    staff use rarely and which would cost every submitted row one more index) puts each
    filter in an index condition: an index finds the matching rows, rather than a walk over
    the user's (or everyone's) rows testing each. (path for alice: at this table's size the
    planner rightly prefers her user index to the trigram one; the staff case shows the
    trigram index serves the filter.)"""
    old = now - timedelta(days=3)
    restore_submit(user=alice, paths=[f"/f/run00/{i}" for i in range(20)], now=old)
    result = restore_submit(user=alice, paths=[f"/f/run01/{i}" for i in range(20)], now=now)
    run_cycle(now=now)  # locates and sends some
    # Many rows the filters leave out (a realistic table: else a scan is the right plan).
    # The listing user's own, so that for alice too the filter, not her user id, is what selects.
    user = alice if who == "alice" else operator
    restore_submit(user=user, paths=[f"/other/{i}" for i in range(3000)], now=now - timedelta(days=1))
    tape = RestoreRequest.objects.filter(tape__isnull=False).values_list("tape__label", flat=True).first()
    from carousel.domain.services import request_cancel
    request_cancel(queryset=RestoreRequest.objects.filter(path__in=["/f/run01/1", "/f/run01/2"]), now=now)
    args = {"state": {"state": ["cancelled"]}, "bulk": {"bulk": result.bulk.id}, "tape": {"tape": tape},
            "since": {"since": now - timedelta(hours=1)}, "until": {"until": now - timedelta(days=2)},
            "path": {"path": "run01"}}[name]
    qs = selectors.request_list(user=user, **args).order_by("-id")[:101]
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE carousel_restorerequest")
        cursor.execute("SET enable_seqscan = off; SET enable_indexscan = off")
        try:
            plan = qs.explain()
        finally:
            cursor.execute("SET enable_seqscan = on; SET enable_indexscan = on")
    conditions = [line for line in plan.splitlines() if "Index Cond" in line or "Recheck Cond" in line]
    assert any(COLUMN[name] in line for line in conditions), plan


def test_a_submission_writes_items_only_for_files_asked_for_again(as_alice, alice, now):
    first = as_alice.post(URL, {"paths": ["/i/a", "/i/b"]}, format="json").json()
    second = as_alice.post(URL, {"paths": ["/i/b", "/i/c", "/i/d"]}, format="json").json()
    assert (second["created"], second["existing"]) == (2, 1)
    from carousel.models import BulkItem
    assert list(BulkItem.objects.values_list("bulk_id", "request__path")) == [
        (__import__("uuid").UUID(second["bulk_id"]), "/i/b")]
    # Both submissions list every path they asked for, right after the POST; the bulk's
    # counts and its cancel cover them all.
    for bulk, paths in ((first, ["/i/a", "/i/b"]), (second, ["/i/b", "/i/c", "/i/d"])):
        listed = as_alice.get(URL, {"bulk": bulk["bulk_id"]}).json()["results"]
        assert sorted(r["path"] for r in listed) == paths
        assert as_alice.get(f"/api/v1/bulks/{bulk['bulk_id']}/").json()["states"]["queued"] == len(paths)
    # /i/b is asked for by the first submission too, which is not cancelled: it stays.
    assert as_alice.post(f"/api/v1/bulks/{second['bulk_id']}/cancel/").json()["cancelled"] == 2
    assert sorted(RestoreRequest.objects.filter(state="queued").values_list("path", flat=True)) == ["/i/a", "/i/b"]


def test_the_list_from_rows_renders_what_the_serializer_renders_from_instances(varied, as_operator, alice, now):
    """The list's page is rendered from values() rows (no model instances); each row must come
    out as RequestSerializer gives it for the instance, in UTC and in another time zone."""
    restore_submit(user=alice, paths=["/l/new"], now=now + timedelta(seconds=20))  # neither located nor sent
    # A done copy on the stager's disk (disk_path), and an error.
    RestoreRequest.objects.filter(path="/l/b", state="done").update(staged_path="/disk/l/b")
    RestoreRequest.objects.filter(path="/l/e").update(error_class="user", last_error="quota")
    varied = list(RestoreRequest.objects.select_related("tape", "user").order_by("id"))
    assert any(r.job_id for r in varied) and any(r.job_id is None for r in varied)
    assert any(r.tape_id for r in varied) and any(r.tape_id is None for r in varied)
    assert any(r.pin_lifetime for r in varied) and any(r.state == "done" and r.staged_path for r in varied)

    def rows():
        return request_list_data(request_list_values(RestoreRequest.objects.order_by("id")))

    assert rows() == RequestSerializer(varied, many=True).data
    with timezone.override(zoneinfo.ZoneInfo("America/New_York")):
        assert rows() == RequestSerializer(varied, many=True).data
    # A time stamp on a whole second (no fraction), as the server formats it.
    RestoreRequest.objects.filter(path="/l/new").update(created_at=now.replace(microsecond=0))
    varied = list(RestoreRequest.objects.select_related("tape", "user").order_by("id"))
    assert rows() == RequestSerializer(varied, many=True).data
    # And the view serves exactly that, newest first.
    listed = as_operator.get(URL).json()["results"]
    assert listed == json.loads(JSONRenderer().render(RequestSerializer(varied[::-1], many=True).data))
