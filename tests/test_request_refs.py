"""A request's user, group and submission are checked by triggers on PostgreSQL, once a statement
(migration 0014_request_refs), where foreign key constraints checked each row at the commit:
the same guarantees, on every path that writes or deletes them, and under two real connections
racing a delete against an insert."""
import threading
import uuid
import time

import pytest
from django.contrib.auth.models import Group, User
from django.db import IntegrityError, connection, connections, transaction

from carousel.domain.services import restore_submit
from carousel.infra import db
from carousel.models import Bulk, RestoreRequest

from .conftest import make_user

pytestmark = pytest.mark.skipif("connection.vendor != 'postgresql'",
                                reason="SQLite keeps its constraints (0014_request_refs)")

MISSING_KEYS = {"user_id": 987654321, "group_id": 987654321, "bulk_id": uuid.UUID(int=1)}


def _row(bulk, **changes):
    """The columns of a second request like `bulk`'s first, for another file."""
    request = RestoreRequest.objects.filter(bulk=bulk).values().first()
    request.pop("id")
    request.update(path="/refs/other", path_key=uuid.UUID(int=request["path_key"].int ^ 1))
    request.update(changes)
    return request


@pytest.mark.parametrize("column", ["user_id", "group_id", "bulk_id"])
@pytest.mark.parametrize("writer", ["insert", "copy"])
def test_a_request_naming_a_missing_user_group_or_submission_is_refused(alice, now, column, writer):
    bulk = restore_submit(user=alice, paths=["/refs/a"], now=now).bulk
    row = _row(bulk, **{column: MISSING_KEYS[column]})
    with pytest.raises(IntegrityError, match="is not present"), transaction.atomic():
        if writer == "insert":
            RestoreRequest.objects.create(**row)
        else:
            columns = list(row)
            db.insert_rows(RestoreRequest, columns, [[row[c] for c in columns]], ids=False)
    assert RestoreRequest.objects.count() == 1


@pytest.mark.parametrize("column", ["user_id", "group_id", "bulk_id"])
def test_pointing_a_request_at_a_missing_row_is_refused(alice, now, column):
    bulk = restore_submit(user=alice, paths=["/refs/a"], now=now).bulk
    missing = MISSING_KEYS[column]
    with pytest.raises(IntegrityError, match="is not present"), transaction.atomic():
        RestoreRequest.objects.filter(bulk=bulk).update(**{column: missing})
    # Setting one to null, as a group's or submission's deletion does, is no reference.
    if column != "user_id":
        RestoreRequest.objects.filter(bulk=bulk).update(**{column: None})


@pytest.mark.parametrize("table", ["auth_user", "auth_group", "carousel_bulk"])
def test_deleting_a_row_a_request_still_names_is_refused(alice, now, table):
    bulk = restore_submit(user=alice, paths=["/refs/a"], now=now).bulk
    key = {"auth_user": alice.pk, "auth_group": alice.account.group_id, "carousel_bulk": bulk.pk}[table]
    with pytest.raises(IntegrityError, match="still referenced"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table} WHERE id = %s", [key])
    assert RestoreRequest.objects.filter(bulk=bulk).exists()


def test_the_applications_deletions_go_through(alice, bob, now):
    """Django's on_delete runs first: a user's requests go with the user; a group or a
    submission deleted leaves its requests without one."""
    mine = restore_submit(user=alice, paths=["/refs/a", "/refs/b"], now=now).bulk
    theirs = restore_submit(user=bob, paths=["/refs/a"], now=now).bulk
    Group.objects.filter(pk=alice.account.group_id).delete()
    assert set(RestoreRequest.objects.values_list("group_id", flat=True)) == {None}
    Bulk.objects.filter(pk=theirs.pk).delete()
    assert RestoreRequest.objects.filter(user=bob, bulk__isnull=True).count() == 1
    User.objects.filter(pk=alice.pk).delete()
    assert not RestoreRequest.objects.filter(bulk_id=mine.pk).exists()
    assert RestoreRequest.objects.filter(user=bob).count() == 1


def _in_thread(target):
    result = {}

    def run():
        try:
            result["value"] = target()
        except Exception as exc:  # noqa: BLE001 - reported to the test
            result["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def test_a_user_deleted_while_a_submission_of_theirs_commits_is_refused(transactional_db, now):
    """The submission locks the user's row (FOR KEY SHARE, as a constraint's check does): the
    delete waits for it, then sees its requests and is refused."""
    carol = make_user("carol", "analysis")
    inserted, commit = threading.Event(), threading.Event()

    def submit():
        with transaction.atomic():
            restore_submit(user=carol, paths=[f"/refs/{i}" for i in range(20)], now=now)
            inserted.set()
            commit.wait(10)

    submitter, _ = _in_thread(submit)
    assert inserted.wait(10)

    def delete():
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("DELETE FROM carousel_account WHERE user_id = %s", [carol.pk])
            cursor.execute("DELETE FROM auth_user_groups WHERE user_id = %s", [carol.pk])
            cursor.execute("DELETE FROM auth_user WHERE id = %s", [carol.pk])

    deleter, result = _in_thread(delete)
    time.sleep(0.5)
    assert deleter.is_alive()  # waits for the submission's lock on the user
    commit.set()
    submitter.join(10)
    deleter.join(10)
    assert isinstance(result.get("error"), IntegrityError), result
    assert RestoreRequest.objects.filter(user=carol).count() == 20
    assert User.objects.filter(pk=carol.pk).exists()


def test_a_submission_for_a_user_deleted_meanwhile_is_refused(transactional_db, now):
    """The other order: the user's deletion holds the row; the submission's check waits for it,
    then finds the user gone and refuses the requests (none is stored)."""
    dave = make_user("dave", "analysis")
    deleted, commit = threading.Event(), threading.Event()

    def delete():
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("DELETE FROM auth_user WHERE id = %s", [dave.pk])
            deleted.set()
            commit.wait(10)

    erin = make_user("erin", "analysis")
    row = _row(restore_submit(user=erin, paths=["/refs/a"], now=now).bulk, user_id=dave.pk, bulk_id=None)

    def insert():
        with transaction.atomic():
            db.insert_rows(RestoreRequest, list(row), [list(row.values())], ids=False)

    with connection.cursor() as cursor:  # nothing else names the user: its deletion is allowed
        cursor.execute("DELETE FROM carousel_account WHERE user_id = %s", [dave.pk])
        cursor.execute("DELETE FROM auth_user_groups WHERE user_id = %s", [dave.pk])
    deleter, _ = _in_thread(delete)
    assert deleted.wait(10)
    inserter, result = _in_thread(insert)
    time.sleep(0.5)
    assert inserter.is_alive(), result  # waits for the deletion's lock on the user
    commit.set()
    deleter.join(10)
    inserter.join(10)
    assert isinstance(result.get("error"), IntegrityError), result
    assert not RestoreRequest.objects.filter(user_id=dave.pk).exists()
