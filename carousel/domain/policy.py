"""Who may do what: the one rule every door asks (the native API, the Tape REST door, the pages,
the admin's actions and the server side of the command line).

An identity is a user and the credential it came with (`Identity`): a session or an API token
is the user's whole power; a WLCG JWT narrows it to the token's scopes (common JWT profile
1.3). What the user may do decides whether an object is even seen; the token then decides
which of the seen objects it may act on:

- **see** (404 otherwise, so that existence does not leak): one's own requests and
  submissions; a service account's, also what it submitted for others (never what the person
  submitted themselves); an operator's, everyone's, by the view permission on restore
  requests (on bulks for submissions). Staff status alone grants nothing. The Tape REST door
  shows one's own stage requests only, operators' included (stage_requests).
- **act** (cancel, release/evict; 403 where seen but not allowed): one's own requests, a
  service account's also what it submitted for a person (never the person's own request or
  pin, even where its submission lists it); anyone's with the change permission
  on restore requests. The list forms (many ids, a whole submission, paths) skip what may not
  be acted on and count what was done. The forms by path act on one's own requests only,
  unless the caller asks for all users and holds the change permission.
- **WLCG scopes**: `storage.stage:P` allows submit, read, cancel and release under P;
  `storage.poll:P` allows read (and archiveinfo) under P only; any other scope, or none,
  allows nothing on either door. A submission (a stage request) is read, and deleted, whole: a
  token reads it only if its scopes cover every path of it (readable_bulks). A credential
  that allows an action on no path at all is refused whole (InsufficientScope: 403 with
  `WWW-Authenticate: Bearer error="insufficient_scope"`).
  A token's wlcg.groups never replace its scopes: they only choose, for that request, the
  groups whose path prefixes the path authorisation plugin (carousel/domain/authz.py) reads.
- **others' paths, the stager's last error, everyone's usage**: the view permission (restore
  requests; usage days for the usage report). **Operate** (pause, retry, lift quarantines):
  the change permission on the model acted on (the admin declares it on each action).

Token scope prefixes are absolute (the issuer's base path joined, carousel/grid/tokens.py); a
grant is read by duck typing (`stage`, `poll` tuples) so the domain does not import the door."""
import re
from dataclasses import dataclass

from django.db.models import Exists, OuterRef, Q

from carousel.domain import authz
from carousel.domain.exceptions import NotAllowed, NotFound
from carousel.domain.paths import under_any
from carousel.models import Account, Bulk, BulkItem, Intake, RestoreRequest

SUBMIT, READ, CANCEL, RELEASE = "submit", "read", "cancel", "release"
ACTIONS = (SUBMIT, READ, CANCEL, RELEASE)
_STAGING = (SUBMIT, CANCEL, RELEASE)  # what storage.stage alone allows; READ: stage or poll
_SLASHES = re.compile(r"/{2,}")


class InsufficientScope(NotAllowed):
    """The token's scopes do not allow this action (anywhere, or on this path): RFC 6750's header."""

    code = "insufficient_scope"
    headers = {"WWW-Authenticate": 'Bearer error="insufficient_scope"'}


@dataclass(frozen=True)
class Identity:
    """A user and the credential it came with. `grant`: a WLCG token's (None: a session or an
    API token, which carry the user's whole power)."""

    user: object
    grant: object = None

    @classmethod
    def of(cls, user, auth=None):
        """From a request's user and auth (DRF's request.auth: an API token, a WLCG grant, None)."""
        return cls(user=user, grant=auth if hasattr(auth, "stage") and hasattr(auth, "poll") else None)


def identity(request):
    """The identity of a Django or DRF request."""
    return Identity.of(request.user, getattr(request, "auth", None))


def _as_identity(who):
    return who if isinstance(who, Identity) else Identity(user=who)


# --- staff, by Django permission --------------------------------------------------------------

def may_see_all(user, model="restorerequest"):
    """Everyone's requests (bulks: submissions), others' paths, the stager's last error."""
    return user.has_perm(f"carousel.view_{model}") or user.has_perm(f"carousel.change_{model}")


# What a viewer without the view permission sees of the loop's last error: an exception's text
# can name any user's path (the live page and /api/v1/stager/).
HIDDEN_ERROR = "an error (shown to operators)"


def may_change_all(user):
    """Cancel, release and retry anyone's requests."""
    return user.has_perm("carousel.change_restorerequest")


def may_see_all_usage(user):
    """Every line of the usage report (others see their own, or their groups')."""
    return user.has_perm("carousel.view_usageday") or user.has_perm("carousel.change_usageday")


def acts_for_others(user, *, cached=True):
    """Whether the user is a service account (it may submit on behalf of others). The API's
    token cache keeps the answer on the user it caches (api.authentication)."""
    known = getattr(user, "carousel_acts_for_others", None) if cached else None
    if known is not None:
        return known
    return Account.objects.filter(user=user, acts_for_others=True).exists()


# --- WLCG scopes --------------------------------------------------------------------------------

def _prefixes(grant, action):
    return grant.stage if action in _STAGING else (*grant.stage, *grant.poll)


def scope_allows(who, action, path):
    """Whether the credential's scopes allow `action` on `path` (always, without a token)."""
    grant = _as_identity(who).grant
    if grant is None:
        return True
    # As sent (a submission's paths are normalised later): //a//b is /a/b.
    return isinstance(path, str) and under_any(_SLASHES.sub("/", path), set(_prefixes(grant, action)))


def scope_allows_any(who, action):
    """Whether the credential allows `action` on some path at all."""
    grant = _as_identity(who).grant
    return grant is None or bool(_prefixes(grant, action))


def require_scope(who, action):
    """Refuse a credential that may do `action` nowhere, before anything is read or changed."""
    if not scope_allows_any(who, action):
        raise InsufficientScope(f"the token's scopes do not allow {action} on any path: it needs "
                                + ("storage.stage" if action in _STAGING else "storage.stage or storage.poll"))


def require_scope_covers(who, action, paths):
    """Refuse the whole call unless the scopes allow `action` on every path (submit, poll)."""
    require_scope(who, action)
    refused = [p for p in paths if not scope_allows(who, action, p)]
    if refused:
        raise InsufficientScope(f"the token's scopes do not allow {action} of {len(refused)} path(s), "
                                f"e.g. {str(refused[0])[:300]}")


def poll_refusals(who, paths):
    """{index: why} for the (normalised) paths the identity may not poll or ask archiveinfo of:
    outside its token's scopes, or outside what the path authorisation lets the user restore
    (an API token's user may not probe paths beyond its groups' prefixes). archiveinfo answers
    these one by one with `error` and the others with their locality."""
    who = _as_identity(who)
    out = {i: "the token's scopes do not allow polling this path" for i, p in enumerate(paths)
           if not scope_allows(who, READ, p)}
    rest = [(i, p) for i, p in enumerate(paths) if i not in out]
    for j, _path, reason in authz.paths_refused(user=who.user, paths=[p for _, p in rest], action=authz.RESTORE):
        out[rest[j][0]] = reason
    return out


def _scope_q(who, action, field="path"):
    """The rows whose `field` (a path) the scopes allow `action` on, as a filter (None: all)."""
    grant = _as_identity(who).grant
    if grant is None:
        return None
    prefixes = set(_prefixes(grant, action))
    if "/" in prefixes:
        return None
    q = Q(pk__in=[])
    for prefix in prefixes:
        q |= Q(**{field: prefix}) | Q(**{f"{field}__startswith": prefix + "/"})
    return q


def _bulk_outside_scope(who, action):
    """Whether a submission (OuterRef "pk") holds a path the scopes do not allow `action` on, as
    an expression (None: a credential without scopes, or scoped to "/"). Asked of the database
    (the submission's index, stopping at the first path outside): the paths, up to 100,000,
    are never loaded."""
    scope = _scope_q(who, action)
    if scope is None:
        return None
    created = RestoreRequest.objects.filter(bulk_id=OuterRef("pk")).exclude(scope)
    again = BulkItem.objects.filter(bulk_id=OuterRef("pk")).exclude(_scope_q(who, action, "request__path"))
    waiting = Intake.objects.filter(bulk_id=OuterRef("pk")).exclude(scope)
    return Exists(created) | Exists(again) | Exists(waiting)


# --- requests and submissions -------------------------------------------------------------------

def _own_q(user):
    """A user's requests; a service account's, also those it submitted for a person (created by
    its own submission: RestoreRequest.bulk), never the person's own requests it asked again."""
    if acts_for_others(user):
        return Q(user=user) | Q(bulk__submitter=user)
    return Q(user=user)


def visible_requests(who):
    """The requests an identity may see (the lists): its own; with the view permission,
    everyone's; a token's, those its scopes allow it to read."""
    who = _as_identity(who)
    qs = RestoreRequest.objects.all()
    if not may_see_all(who.user):
        qs = qs.filter(_own_q(who.user))
    scope = _scope_q(who, READ)
    return qs if scope is None else qs.filter(scope)


def own_requests(who, action):
    """The identity's own requests it may do `action` on (its scopes applied): what the forms
    by path act on."""
    who = _as_identity(who)
    qs = RestoreRequest.objects.filter(_own_q(who.user))
    scope = _scope_q(who, action)
    return qs if scope is None else qs.filter(scope)


def actionable_requests(who, action):
    """The requests an identity may do `action` (cancel, release) on: its own, or everyone's
    with the change permission; its scopes applied. The list forms act on these and skip the rest."""
    who = _as_identity(who)
    if not may_change_all(who.user):
        return own_requests(who, action)
    scope = _scope_q(who, action)
    qs = RestoreRequest.objects.all()
    return qs if scope is None else qs.filter(scope)


def check_request(who, action, req):
    """Raise unless the identity may do `action` on the request `req`: NotFound (404) where it
    may not even see it, NotAllowed (403) where it sees it but may not do this, InsufficientScope
    (403 and RFC 6750's header) where its token's scopes do not cover the path."""
    who = _as_identity(who)
    user = who.user
    mine = req.user_id == user.pk or (req.bulk_id is not None and acts_for_others(user)
                                      and Bulk.objects.filter(pk=req.bulk_id, submitter=user).exists())
    if not mine and not may_see_all(user):
        raise NotFound(f"no request {req.pk} visible to you")
    if action != READ and not mine and not may_change_all(user):
        raise NotAllowed("you may see this request but not act on it: acting on another user's request needs "
                         "the change permission on restore requests")
    if not scope_allows(who, action, req.path):
        raise InsufficientScope(f"the token's scopes do not allow {action} of {req.path[:300]}")


def visible_bulks(who):
    """A user's submissions (a service account's: also those it made for others); with the view
    permission on bulks, everyone's."""
    user = _as_identity(who).user
    qs = Bulk.objects.all()
    if may_see_all(user, "bulk"):
        return qs
    return qs.filter(Q(user=user) | Q(submitter=user)) if acts_for_others(user) else qs.filter(user=user)


def readable_bulks(who):
    """The submissions an identity may read (the native API's list and detail): visible_bulks,
    and for a WLCG token those whose every path its scopes let it read (a token scoped to
    /elsewhere does not read alice's /data submission, as the Tape REST poll refuses it)."""
    who = _as_identity(who)
    qs = visible_bulks(who)
    if not scope_allows_any(who, READ):
        return qs.none()
    outside = _bulk_outside_scope(who, READ)
    return qs if outside is None else qs.exclude(outside)


def bulk_covered(who, action, bulk):
    """Whether the credential's scopes allow `action` on every path of the submission: a
    database probe, not its paths."""
    outside = _bulk_outside_scope(who, action)
    return outside is None or not Bulk.objects.filter(pk=bulk.pk).filter(outside).exists()


def require_bulk_covered(who, action, bulk):
    """Refuse (InsufficientScope) unless the token's scopes allow `action` on every path of the
    submission (reading it whole, deleting a stage request)."""
    require_scope(who, action)
    if not bulk_covered(who, action, bulk):
        raise InsufficientScope(f"the token's scopes do not allow {action} of every path of submission {bulk.pk}")


def check_bulk(who, action, bulk):
    """As check_request, for a whole submission (its requests are then filtered one by one with
    actionable_requests: a service account's submission may hold a person's own request)."""
    who = _as_identity(who)
    user = who.user
    mine = user.pk in (bulk.user_id, bulk.submitter_id)
    if not mine and not may_see_all(user, "bulk"):
        raise NotFound(f"no submission {bulk.pk} visible to you")
    if action != READ and not mine and not may_change_all(user):
        raise NotAllowed("you may see this submission but not cancel it: cancelling another user's requests "
                         "needs the change permission on restore requests")
    require_scope(who, action)


def own_bulks(who):
    """The identity's own submissions, and a service account's made for others: what the forms
    by path look into for files still in the intake."""
    user = _as_identity(who).user
    return Bulk.objects.filter(Q(user=user) | Q(submitter=user))


def stage_requests(who):
    """The stage requests the Tape REST door shows an identity and lets it act on: its own
    submissions, a service account's also those it submitted for a person (own_bulks).
    Deliberately narrower than visible_bulks: on that door a stage request belongs to the client
    that posted it (the WLCG document has no listing and no one else's view); an operator sees
    and acts on others' submissions through the native API and the admin. Then check_bulk
    decides the action, and the requests acted on are actionable_requests: a service's stage
    request may hold the person's own request, which it never cancels or releases."""
    return own_bulks(who)


def shows_stage_request(user, owner_id, submitter_id):
    """stage_requests for a submission known by its owner and submitter (a cached poll)."""
    return user.pk in (owner_id, submitter_id)


def bulk_whole(who, bulk):
    """Whether the identity's cancel covers every path of a submission: then the submission
    itself is marked cancelled (a token scoped to part of it cancels that part only)."""
    return bulk_covered(who, CANCEL, bulk)


def may_act_for_all_users(user):
    """`--all-users` of the forms by path: the change permission on restore requests."""
    return may_change_all(user)
