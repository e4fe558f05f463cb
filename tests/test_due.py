"""The cycle's questions (carousel/loop/due.py): each condition's SQL says exactly what its step's
own queryset selects, on generated tables (every request state, times on both sides of the
cycle's time and on it), and a cycle runs only the steps that have something to do."""
from datetime import timedelta
from unittest import mock

from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from hypothesis import given, settings, strategies as st

from carousel.domain.services import restore_submit
from carousel.loop.cycle import run_cycle
from carousel.loop.due import AFTER, BEFORE, CONDITIONS, ask
from carousel.models import (IN_FLIGHT_STATES, TERMINAL_STATES, Bulk, Job, JobState, RequestState as S, RestoreRequest,
                             StagerCall)
from carousel.stagers.immediate import ImmediateStager

# Seconds from the cycle's time: before, on it (the < and <= of each condition), after.
OFFSETS = st.sampled_from([None, -3600, -1, 0, 1, 3600])
FILES = 4


class _Undo(Exception):
    pass


@st.composite
def worlds(draw):
    requests = [dict(state=draw(st.sampled_from(S.values)), deadline=draw(OFFSETS), retry_at=draw(OFFSETS),
                     pin_until=draw(OFFSETS)) for _ in range(FILES)]
    bulk = dict(pending=draw(st.sampled_from([0, 1, 7])), paths_searchable=draw(st.booleans()),
                notify=draw(st.booleans()), notified_at=draw(st.sampled_from([None, -60])))
    job_state = draw(st.sampled_from(JobState.values))
    calls = draw(st.lists(OFFSETS.filter(lambda o: o is not None), max_size=2))
    # A second job, which may jump the queue and may follow the first (preempt's candidates).
    second = dict(state=draw(st.sampled_from(JobState.values)), jumps_queue=draw(st.booleans()),
                  follows=draw(st.booleans()))
    return requests, bulk, job_state, calls, second


def _at(now, offset):
    return None if offset is None else now + timedelta(seconds=offset)


def test_each_condition_says_what_its_steps_query_selects(alice, now):
    bulk = restore_submit(user=alice, now=now, paths=[f"/due/{i}" for i in range(FILES)]).bulk
    ids = list(RestoreRequest.objects.filter(bulk=bulk).order_by("id").values_list("id", flat=True))
    job = Job.objects.create(created_at=now)
    other = Job.objects.create(created_at=now)

    @settings(max_examples=120, deadline=None, database=None)
    @given(world=worlds())
    def agree(world):
        requests, bulk_fields, job_state, calls, second = world
        try:
            with transaction.atomic():
                Job.objects.filter(id=job.id).update(state=job_state)
                Job.objects.filter(id=other.id).update(state=second["state"], jumps_queue=second["jumps_queue"],
                                                       after=job if second["follows"] else None)
                for request_id, fields in zip(ids, requests):
                    state = fields["state"]
                    RestoreRequest.objects.filter(id=request_id).update(
                        state=state, deadline=_at(now, fields["deadline"]), pin_until=_at(now, fields["pin_until"]),
                        # What each state implies (the table's checks): a retry has its time, a
                        # file in flight its job, a finished one its end.
                        retry_at=_at(now, fields["retry_at"] if fields["retry_at"] is not None or state != S.RETRY
                                     else 0),
                        job=job if state in IN_FLIGHT_STATES else None,
                        submitted_at=now if state in IN_FLIGHT_STATES else None,
                        started_at=now if state == S.STAGING else None,
                        finished_at=now if state in TERMINAL_STATES else None)
                Bulk.objects.filter(id=bulk.id).update(**{**bulk_fields, "notified_at": _at(now, bulk_fields["notified_at"])})
                for offset in calls:
                    StagerCall.objects.create(kind=StagerCall.Kind.RELEASE, backend_id="b", paths=["/due/0"],
                                              created_at=now, next_at=_at(now, offset))
                asked = ask(list(CONDITIONS), now=now)
                for name, (_, _, queryset) in CONDITIONS.items():
                    assert asked[name] == queryset(now).exists(), (name, world)
                raise _Undo
        except _Undo:
            pass

    agree()


def test_the_two_questions_name_every_condition_once():
    assert sorted(BEFORE + AFTER) == sorted(CONDITIONS)


def test_a_cycle_runs_a_step_only_when_it_has_something_to_do(alice, now):
    restore_submit(user=alice, now=now, paths=["/run1/a", "/run1/b"], pin_lifetime=timedelta(seconds=30))
    stager = ImmediateStager()
    t = now
    for _ in range(4):  # located, sent, done (pinned for 30 s)
        t += timedelta(seconds=10)
        run_cycle(now=t, stager=stager)
    assert set(RestoreRequest.objects.values_list("state", flat=True)) == {S.DONE}
    with CaptureQueriesContext(connection) as idle, mock.patch("carousel.loop.cycle.preempt") as preempt:
        run_cycle(now=t + timedelta(seconds=1), stager=stager)
    assert not preempt.called, "an idle cycle looked for a long mount to cut"
    idle_sql = [q["sql"] for q in idle.captured_queries]
    # The pins run out: the next cycle ends them and sends their releases in the same cycle.
    with CaptureQueriesContext(connection) as pins_out:
        report = run_cycle(now=t + timedelta(seconds=60), stager=stager)
    assert RestoreRequest.objects.filter(pin_until__isnull=False).count() == 0
    assert report.stager_calls == 1 and not StagerCall.objects.exists()
    assert not [s for s in idle_sql if "pin_until" in s and "EXISTS" not in s], "an idle cycle looked for pins to end"
    assert not [s for s in idle_sql if "carousel_stagercall" in s and "EXISTS" not in s], "an idle cycle read calls"
    assert [s for s in (q["sql"] for q in pins_out.captured_queries) if "pin_until" in s and "FOR" in s]
