import pytest
from django.db import IntegrityError, transaction

from carousel.models import Job, RestoreRequest, Transition, path_key
from carousel.domain.services import request_transition, restore_submit


def one(alice, now, path="/a"):
    restore_submit(user=alice, paths=[path], now=now)
    return RestoreRequest.objects.get(path=path)


def test_a_lost_race_changes_nothing(alice, now):
    req = one(alice, now)
    qs = RestoreRequest.objects.filter(pk=req.pk)
    assert request_transition(qs, "cancelled", now=now) == 1
    # A late "done" from the stager must not resurrect a cancelled request.
    assert request_transition(qs, "done", now=now) == 0
    req.refresh_from_db()
    assert req.state == "cancelled"


def test_every_state_change_is_recorded_with_its_time(alice, now):
    req = one(alice, now)
    job = Job.objects.create(created_at=now)
    qs = RestoreRequest.objects.filter(pk=req.pk)
    request_transition(qs, "submitted", now=now, job=job)
    request_transition(qs, "staging", now=now)
    request_transition(qs, "done", now=now)
    assert list(Transition.objects.order_by("id").values_list("from_state", "to_state")) == [
        ("queued", "submitted"), ("submitted", "staging"), ("staging", "done")]
    req.refresh_from_db()
    assert req.attempts == 1 and req.submitted_at == req.started_at == req.finished_at == now


@pytest.mark.parametrize("fields", [
    {"state": "done"},  # a finished state needs finished_at
    {"state": "submitted"},  # in flight needs a job and submitted_at
    {"state": "retry"},  # waiting needs its retry time
    {"state": "nonsense"},
    {"priority": 7},
])
def test_check_constraints_tie_states_to_their_timestamps(alice, now, fields):
    req = one(alice, now)
    with pytest.raises(IntegrityError), transaction.atomic():
        RestoreRequest.objects.filter(pk=req.pk).update(**fields)


def test_one_active_request_per_user_and_file_is_enforced_by_the_database(alice, now):
    req = one(alice, now)
    with pytest.raises(IntegrityError), transaction.atomic():
        RestoreRequest.objects.create(user=alice, path="/a", path_key=path_key("/a"), created_at=now, updated_at=now)
    assert req.path_key == path_key("/a")


def test_long_paths_are_keyed_by_their_digest(alice, now):
    long_path = "/" + "d" * 4000
    req = one(alice, now, path=long_path)
    assert req.path == long_path
