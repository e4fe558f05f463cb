"""Who sees and who may cancel which requests and submissions: the one place these rules live."""
from django.db.models import Q

from carousel.models import Account, Bulk, RestoreRequest


# Operators' powers follow Django's permissions, never is_staff alone (a staff account may
# hold no permission at all): the view permission on a model shows everyone's rows, the
# change permission on restore requests lets one cancel anyone's.
def may_view_all(user, model="restorerequest"):
    return user.has_perm(f"carousel.view_{model}") or user.has_perm(f"carousel.change_{model}")


def may_change_all(user):
    return user.has_perm("carousel.change_restorerequest")


def acts_for_others(user, *, cached=True):
    """Whether the user is a service account (it may submit on behalf of others). The API's
    token cache keeps the answer on the user it caches (api.authentication)."""
    known = getattr(user, "carousel_acts_for_others", None) if cached else None
    if known is not None:
        return known
    return Account.objects.filter(user=user, acts_for_others=True).exists()


def _own(user):
    """A user's requests; for a service account, also those it submitted for others (the
    XRootD hooks find and cancel what they asked for on a person's behalf)."""
    if acts_for_others(user):
        return Q(user=user) | Q(bulk__submitter=user)
    return Q(user=user)


def visible_requests(user):
    """The requests a user may see: their own; with the view permission, everyone's."""
    qs = RestoreRequest.objects.all()
    return qs if may_view_all(user) else qs.filter(_own(user))


def cancellable_requests(user):
    """The requests a user may cancel: their own; with the change permission, everyone's."""
    qs = RestoreRequest.objects.all()
    return qs if may_change_all(user) else qs.filter(_own(user))


def visible_bulks(user):
    """A user's submissions (a service account's: also those it made for others); with the view
    permission, everyone's."""
    qs = Bulk.objects.all()
    if may_view_all(user, "bulk"):
        return qs
    return qs.filter(Q(user=user) | Q(submitter=user)) if acts_for_others(user) else qs.filter(user=user)
