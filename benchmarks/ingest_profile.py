"""Where the time of one 100,000-path submission goes: the companion of benchmarks/ingest.py.

    cd /work/main && .venv/bin/python -m carousel.infra.localservices -- .venv/bin/python benchmarks/ingest_profile.py

Same database setup as ingest.py (PostgreSQL only, a fresh database), no HTTP server. The
table first gets --preload batches of 100,000 requests, as in the middle of an ingest.py run.
Then, in each of --runs rounds, each with new paths and a new database connection (gunicorn
opens one per request):

1. phases: the steps of POST /api/v1/requests/ one after the other, with the code they run
   (DRF's parser, SubmitSerializer, validate_paths, path_key, the ORM queries and the SQL of
   carousel.infra.db.insert_rows) in one committed transaction, each timed;
2. restore_submit: the real service, whole, to check that the phases add up to it;
3. request: the whole view through Django's test client (middleware, DRF, service, response).

It prints the median of each. Since the intake (carousel/domain/intake.py) a submission this big is
answered once its files are in the intake; this profile measures the direct path (intake.direct():
the requests stored within the call), which is what the intake's move into the queue costs. The phases mirror restore_submit and carousel.infra.db.insert_rows: when those change,
the "phases, sum" and "restore_submit, whole" lines drift apart and the phases need updating.

Then it measures what the database server alone spends to store 100,000 requests and their
bulk items (EXPLAIN ANALYZE of INSERT ... SELECT from a staging table, foreign keys checked at
once), as the schema is, and what it would save without each index, the foreign keys or the
triggers, each variant in a transaction that is rolled back. The whole takes about five minutes."""
import argparse
import io
import json
import re
import statistics
import time
import uuid
from collections import defaultdict
from contextlib import contextmanager

from ingest import WARMUP_FILES, batch_paths, copy_rows, setup_database, setup_django

FILES = 100_000


class Phases:
    def __init__(self):
        self.seconds = defaultdict(list)

    @contextmanager
    def __call__(self, name):
        start = time.perf_counter()
        yield
        self.seconds[name].append(time.perf_counter() - start)

    def report(self):
        width = max(map(len, self.seconds))
        for name, seconds in self.seconds.items():
            print(f"  {name:{width}}  {statistics.median(seconds):6.3f} s")


def submit_in_phases(phase, user, body, now):
    """What the view and restore_submit do for a submission of new paths, step by step."""
    from django.conf import settings
    from django.db import connection, transaction
    from rest_framework.parsers import JSONParser
    from rest_framework.renderers import JSONRenderer

    from api.serializers import SubmitSerializer
    from carousel.models import (ACTIVE_STATES, Account, Bulk, BulkItem, Control, RequestState, RestoreRequest,
                                 path_key)
    from carousel.infra import db
    from carousel.domain.paths import validate_paths

    with phase("DRF JSONParser"):
        data = JSONParser().parse(io.BytesIO(body))
    with phase("SubmitSerializer"):
        form = SubmitSerializer(data=data)
        form.is_valid(raise_exception=True)
        paths = form.validated_data["paths"]
    with phase("validate_paths"):
        clean, errors = validate_paths(paths, max_count=settings.CAROUSEL_MAX_PATHS_PER_SUBMISSION,
                                       max_bytes=settings.CAROUSEL_MAX_PATH_BYTES)
        assert not errors
    with phase("path_key x100k"):
        keys = [path_key(p) for p in clean]
    # restore_submit's transaction.atomic(), opened and committed by hand to time the commit.
    with phase("connect, lock account, control"):
        transaction.set_autocommit(False)
        Account.objects.get_or_create(user=user)
        Account.objects.select_for_update().get(user=user)
        control = Control.get()
    queryset = (RestoreRequest.objects.filter(db.in_keys("path_key", keys), state__in=ACTIVE_STATES)
                .values_list("id", "user_id", "path_key", "state", "job_id", "job_rank", "submitted_at",
                             "started_at"))
    with phase("SELECT active: Django compiles it"):
        sql, params = queryset.query.get_compiler(using="default").as_sql()
    with connection.cursor() as cursor:
        with phase("SELECT active: psycopg + server"):
            cursor.execute(sql, params)
        with phase("SELECT active: fetch"):
            assert not cursor.fetchall()
    with phase("ceiling COUNT"):
        active_now = RestoreRequest.objects.filter(user=user, state__in=ACTIVE_STATES).count()
        assert active_now + len(clean) <= control.default_queued_ceiling
    with phase("group, Bulk row"):
        group = user.groups.order_by("id").first()
        bulk = Bulk.objects.create(user=user, created_at=now, files=len(clean), created=len(clean))
    request_ids = insert_in_phases(phase, "requests", RestoreRequest, (
        "user_id", "group_id", "path", "path_key", "priority", "destination", "deadline", "pin_lifetime",
        "state", "attempts", "error_class", "last_error", "job_id", "job_rank", "created_at", "updated_at",
        "submitted_at", "started_at"),
        ((user.id, group and group.id, p, k, 0, "", None, None, RequestState.QUEUED, 0, "", "", None, 0,
          now, now, None, None) for p, k in zip(clean, keys)))
    insert_in_phases(phase, "bulk items", BulkItem, ("bulk_id", "request_id"), ((bulk.id, i) for i in request_ids),
                     ids=False)
    with phase("commit (deferred FK checks)"):
        connection.commit()
    transaction.set_autocommit(True)
    with phase("response"):
        JSONRenderer().render({"bulk_id": bulk.id, "files": len(clean), "created": len(clean), "existing": 0,
                               "shared": 0, "url": f"http://127.0.0.1/api/v1/bulks/{bulk.id}/"})


def insert_in_phases(phase, label, model, columns, rows, ids=True):
    """carousel.infra.db.insert_rows on PostgreSQL, its halves timed apart."""
    from django.db import connection

    table, pk = model._meta.db_table, model._meta.pk.column
    with phase(f"{label}: building rows"):
        rows = list(rows)
    cols = [model._meta.get_field(c).column for c in columns]
    new_ids = []
    with connection.cursor() as cursor:
        if ids:
            with phase(f"{label}: ids, nextval x100k"):
                cursor.execute("SELECT nextval(pg_get_serial_sequence(%s, %s)) FROM generate_series(1, %s)",
                               [table, pk, len(rows)])
                new_ids = [r[0] for r in cursor.fetchall()]
            cols = [pk, *cols]
            rows = [(i, *row) for i, row in zip(new_ids, rows)]
        with phase(f"{label}: COPY"):
            with cursor.cursor.copy(f"COPY {table} ({', '.join(cols)}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
    return new_ids


def server_costs(database_url, user_id, paths, repeat):
    """Server time (EXPLAIN ANALYZE) of storing the requests of `paths` and their bulk items,
    and what each schema variant saves, each try in a transaction rolled back. The least of
    `repeat` tries: on a busy machine it is the closest to the cost itself."""
    import psycopg

    from carousel.models import path_key

    with psycopg.connect(database_url) as conn, psycopg.connect(database_url, autocommit=True) as vacuum:
        def settle():
            # A rolled-back insert leaves its rows and index entries behind until a vacuum:
            # without one, every variant would find bigger indexes than the one before.
            vacuum.execute("VACUUM (ANALYZE) carousel_restorerequest, carousel_bulkitem")

        def query(sql):
            return [r[0] for r in conn.execute(sql).fetchall()]

        def server_seconds(statement, before=()):
            conn.execute("SET CONSTRAINTS ALL IMMEDIATE")
            for sql in before:
                conn.execute(sql)
            plan = "\n".join(query(f"EXPLAIN (ANALYZE, TIMING OFF, COSTS OFF) {statement}"))
            conn.rollback()
            settle()
            return float(re.search(r"Execution Time: ([\d.]+) ms", plan).group(1)) / 1000

        def least(statement, before=()):
            return min(server_seconds(statement, before) for _ in range(repeat))

        def saving(statement, before, change):
            # The variant alternates with the schema as it is, so that a busy moment of the
            # machine or a slow drift hits both alike; the least of each is compared.
            pairs = [(server_seconds(statement, before), server_seconds(statement, [*before, *change]))
                     for _ in range(repeat)]
            return min(p[0] for p in pairs) - min(p[1] for p in pairs)

        def schema(table):
            indexes = query(f"SELECT indexrelid::regclass::text FROM pg_index i WHERE indrelid = '{table}'::regclass "
                            "AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)")
            fks = query(f"SELECT conname FROM pg_constraint WHERE conrelid = '{table}'::regclass AND contype = 'f'")
            triggers = query(f"SELECT tgname FROM pg_trigger WHERE tgrelid = '{table}'::regclass AND NOT tgisinternal")
            return ([f"DROP INDEX {i}" for i in indexes], [f"ALTER TABLE {table} DROP CONSTRAINT {f}" for f in fks],
                    [f"ALTER TABLE {table} DISABLE TRIGGER {t}" for t in triggers])

        # The requests' ids are drawn beforehand, so the bulk items need no join.
        conn.execute("CREATE TEMP TABLE stage (path text, path_key uuid, id bigint)")
        with conn.cursor().copy("COPY stage (path, path_key) FROM STDIN") as copy:
            for p in paths:
                copy.write_row((p, path_key(p)))
        conn.execute("UPDATE stage SET id = nextval(pg_get_serial_sequence('carousel_restorerequest', 'id'))")
        bulk_id = uuid.uuid4()
        conn.execute("INSERT INTO carousel_bulk (id, user_id, created_at, files, created, notify, label, metadata, activity) "
                     "VALUES (%s, %s, now(), 0, 0, false, '', '{}', '')", [bulk_id, user_id])
        conn.commit()
        settle()

        # As restore_submit writes them: the submission on the request row.
        requests = ("INSERT INTO carousel_restorerequest (id, user_id, bulk_id, path, path_key, priority, "
                    "destination, state, attempts, error_class, last_error, created_at, updated_at) "
                    f"SELECT id, {user_id}, '{bulk_id}', path, path_key, 0, '', 'queued', 0, '', '', now(), now() "
                    "FROM stage")
        items = f"INSERT INTO carousel_bulkitem (bulk_id, request_id) SELECT '{bulk_id}', id FROM stage"
        costs = {"requests, schema as it is": least(requests)}
        indexes, fks, triggers = schema("carousel_restorerequest")
        for drop in indexes:
            costs[f"  saved without {drop.split()[-1]}"] = saving(requests, [], [drop])
        costs["  saved without any of these indexes"] = saving(requests, [], indexes)
        costs["  saved without its foreign keys"] = saving(requests, [], fks)
        if triggers:
            costs["  saved without its triggers"] = saving(requests, [], triggers)
        costs["  saved with no index but the primary key, no FK, no trigger"] = saving(
            requests, [], indexes + fks + triggers)
        _, item_fks, _ = schema("carousel_bulkitem")
        costs["bulk items, schema as it is"] = least(items, [requests])
        costs["  saved without their foreign keys"] = saving(items, [requests], item_fks)
        costs["ids: nextval x100k"] = least(
            f"SELECT nextval(pg_get_serial_sequence('carousel_restorerequest', 'id')) FROM generate_series(1, {FILES})")
        return costs


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="rounds of the three in-process measurements")
    parser.add_argument("--preload", type=int, default=2, help="batches of 100,000 requests loaded first")
    args = parser.parse_args()
    database_url = setup_django()
    from django.db import connection
    from django.test import Client
    from django.utils import timezone

    from carousel.domain import intake
    from carousel.domain.services import restore_submit

    user, key = setup_database(needed_ceiling=(args.preload + 3 * args.runs) * FILES + WARMUP_FILES)
    for batch in range(args.preload):
        copy_rows(database_url, user.id, batch_paths(100 + batch, FILES))
    client = Client(HTTP_HOST="127.0.0.1", HTTP_AUTHORIZATION=f"Token {key}")
    # First use of the URLconf, DRF and the ORM in this process: not what we measure.
    client.post("/api/v1/requests/", {"paths": batch_paths(-1, WARMUP_FILES)}, content_type="application/json")

    phase, totals = Phases(), Phases()
    for run in range(args.runs):
        connection.close()
        body = json.dumps({"paths": batch_paths(3 * run, FILES)}).encode()
        with totals("phases, sum"):
            submit_in_phases(phase, user, body, timezone.now())
        connection.close()
        with totals("restore_submit, whole"), intake.direct():
            restore_submit(user=user, paths=batch_paths(3 * run + 1, FILES), now=timezone.now())
        connection.close()
        body = json.dumps({"paths": batch_paths(3 * run + 2, FILES)}).encode()
        with totals("request in-process, whole (test client)"), intake.direct():
            response = client.post("/api/v1/requests/", body, content_type="application/json")
        assert response.status_code == 201 and response.json()["created"] == FILES, response.content[:500]

    print(f"One submission of {FILES:,} new paths, in-process, median of {args.runs}:")
    phase.report()
    totals.report()
    print(f"\nServer time to store {FILES:,} requests (EXPLAIN ANALYZE, least of 3 tries):")
    costs = server_costs(database_url, user.id, batch_paths(99, FILES), repeat=3)
    width = max(map(len, costs))
    for name, seconds in costs.items():
        print(f"  {name:{width}}  {seconds:6.3f} s")


if __name__ == "__main__":
    main()
