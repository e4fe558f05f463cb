"""Lists of requests: the filters of the API's list and the web page's, a submission's requests."""
from django.db.models import Q

from carousel.domain.selectors.summary import state_counts
from carousel.domain.selectors.visibility import visible_requests
from carousel.infra import db
from carousel.models import BulkItem, Intake, RequestState, RestoreRequest


def request_list(*, user, owner=None, **filters):
    """What `user` (an identity) may see, filtered; given `owner` (a user id), that user's own
    requests only (an operator's "my requests")."""
    # The serializer shows each request's user and tape: joined, not a query per row.
    qs = visible_requests(user).select_related("tape", "user")
    return filter_requests(qs if owner is None else qs.filter(user_id=owner), **filters)


def filter_requests(qs, *, state=None, bulk=None, tape=None, since=None, until=None, path=None):
    """The filters of the API's list and the web page's, in one place."""
    if state:
        qs = qs.filter(state__in=state)
    if bulk:
        # Files of a big submission still in the intake are not requests yet: they are listed
        # once the task or the cycle queues them; bulk_state_counts counts them meanwhile.
        qs = qs.filter(in_bulk(bulk))
    if tape:
        qs = qs.filter(tape__label=tape)
    if since:
        qs = qs.filter(created_at__gte=since)
    if until:
        qs = qs.filter(created_at__lt=until)
    if path:
        qs = qs.filter(db.path_contains(path))
    return qs


def in_bulk(bulk):
    """The requests of a submission: those it created (RestoreRequest.bulk, indexed) and those
    it asked for again (BulkItem). A subquery, not a join: no request appears twice."""
    bulk_id = getattr(bulk, "pk", bulk)
    return Q(bulk_id=bulk_id) | Q(id__in=BulkItem.objects.filter(bulk_id=bulk_id).values("request_id"))


def bulk_requests(bulk):
    """A submission's requests. A read: files still waiting in the intake are not among them
    (a write that acts on the whole submission queues them first: services.bulk_requests_to_act_on)."""
    return RestoreRequest.objects.filter(in_bulk(bulk))


def bulk_state_counts(bulk):
    """{state: count} of a submission's files, zeros included: its files still waiting in the
    intake count as queued, which they will be (carousel/domain/intake.py)."""
    counts = state_counts(bulk_requests(bulk))
    counts[RequestState.QUEUED] += bulk.pending
    return counts


def bulk_paths(bulk):
    """Every path of a submission, those still waiting in the intake included."""
    paths = list(bulk_requests(bulk).values_list("path", flat=True))
    if bulk.pending:
        paths += Intake.objects.filter(bulk_id=bulk.pk).values_list("path", flat=True)
    return paths


def request_page(*, user, state=None, path=None, bulk=None, after=None, size=50):
    """One page of the user's own requests, newest first, keyset-paginated on id: (rows, the
    `after` of the next page or None). Never counts the matches."""
    qs = filter_requests(RestoreRequest.objects.filter(user=user).select_related("tape"), state=state, path=path,
                         bulk=bulk)
    if after:
        qs = qs.filter(id__lt=after)
    rows = list(qs.order_by("-id")[:size + 1])
    return rows[:size], (rows[size - 1].id if len(rows) > size else None)


COUNT_CAP = 10_000


def capped_count(queryset, cap=COUNT_CAP):
    """(count, whether it reached `cap`): stops counting at `cap`."""
    n = queryset.order_by()[:cap].count()
    return n, n >= cap
