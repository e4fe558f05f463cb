"""Who may restore what, and deliver where.

Path authorisation is a plugin, resolved like the stagers (carousel/infra/plugins.py): the setting
CAROUSEL_PATH_AUTHORIZATION names an entry of CAROUSEL_PATH_AUTHORIZATIONS (or is a dotted
path itself). `services.restore_submit` asks it, so every front door (the API, the web form,
the Tape REST door) gets the same answer. Shipped:

- `allow-all` (the default): anyone may restore any path;
- `group-prefixes`: a user may restore a path under a prefix granted to one of their groups
  (PathPrefix rows with purpose "restore", edited in the admin under each group); the grid
  door maps token groups onto the same Django groups, so one table decides for both.

Destinations are not a plugin: a destination is always checked (destination_refused), since
the worker writes there with its own rights. It must lie under a root the operator allows to
everyone (CAROUSEL_DESTINATION_ROOTS) or to one of the user's groups (PathPrefix rows with
purpose "destination"). With no root configured, no destination is accepted. A destination is a
directory; the worker writes each file below it without following links (destination_root
gives it the root, carousel/infra/nofollow.py opens the way down)."""
import os

from django.conf import settings
from django.db.models import Q

from carousel.infra import plugins
from carousel.models import PathPrefix
from carousel.domain.paths import under_any

RESTORE = "restore"
RELEASE = "release"


class PathAuthorization:
    """A site's rule. `refused` returns [(index, path, reason)] for the paths of `paths` that
    `user` may not act on with `action` ("restore", "release"); [] allows them all. It is called
    with a whole submission (up to 100,000 paths): read what it needs once, not per path."""

    def refused(self, *, user, paths, action):
        raise NotImplementedError


class AllowAll(PathAuthorization):
    def refused(self, *, user, paths, action):
        return []


def group_prefixes(user, purpose):
    """The prefixes granted to the user's groups (its memberships and its share group). A user
    that came with a WLCG token: the groups that token names (mapped), not every group some
    token of the subject ever named (carousel/grid/tokens.py sets carousel_token_groups)."""
    if user is None or not user.is_authenticated:
        return set()
    token_groups = getattr(user, "carousel_token_groups", None)
    members = Q(group__user=user) if token_groups is None else Q(group_id__in=list(token_groups))
    return set(PathPrefix.objects.filter(members | Q(group__account__user=user), purpose=purpose)
               .values_list("prefix", flat=True))


class GroupPrefixes(PathAuthorization):
    """A path may be restored (or released) when it is under a prefix granted to one of the
    user's groups; whole components only."""

    def refused(self, *, user, paths, action):
        prefixes = group_prefixes(user, PathPrefix.Purpose.RESTORE)
        if not prefixes:
            reason = "none of your groups may restore anything: ask an operator for a path prefix"
            return [(i, p, reason) for i, p in enumerate(paths)]
        return [(i, p, "not under a prefix your groups may restore from") for i, p in enumerate(paths)
                if not under_any(p, prefixes)]


def paths_refused(*, user, paths, action=RESTORE):
    """[(index, path, reason)] for the paths `user` may not act on, by the configured plugin."""
    return plugins.path_authorization().refused(user=user, paths=paths, action=action)


def destination_roots(user):
    roots = {r.rstrip("/") or "/" for r in settings.CAROUSEL_DESTINATION_ROOTS}
    return roots | group_prefixes(user, PathPrefix.Purpose.DESTINATION)


def destination_root(*, user, path):
    """The root `path` may be written under for `user`, read again from the settings and the
    user's groups (the worker's check, never the stored string's word): the deepest of those it
    lies under; None when there is none any more."""
    return max((r for r in destination_roots(user) if under_any(path, {r})), key=len, default=None)


def _resolved_below(root, destination):
    """`destination` (lexically under `root`) with the symbolic links among its existing
    components resolved and named from `root` again; None when one leads out of the root. The
    worker follows no link below a root (carousel/infra/nofollow.py): this turns a link that
    stays inside into the place it names, and refuses one that leads out at the submission
    rather than at the delivery."""
    base = root.rstrip("/")
    rest = [p for p in destination[len(base):].split("/") if p]
    known = 0
    while known < len(rest) and os.path.lexists(f"{base}/{'/'.join(rest[:known + 1])}"):
        known += 1
    if not known:
        return destination
    real_root = os.path.realpath(root)
    real = os.path.realpath(f"{base}/{'/'.join(rest[:known])}")
    if not under_any(real, {real_root}):
        return None
    return base + real[len(real_root.rstrip("/")):] + "".join(f"/{p}" for p in rest[known:]) or "/"


def destination_place(*, user, destination):
    """(where `user`'s files are delivered, None) for the normalised `destination`, its links
    inside a root resolved; (None, why not) when it is not under a root the user may deliver to,
    or leads out of it through a symbolic link. Empty stays empty (no delivery)."""
    if not destination:
        return "", None
    roots = destination_roots(user)
    if not roots:
        return None, "no destination root is configured for you: leave the destination empty, or ask an operator"
    under = sorted((r for r in roots if under_any(destination, {r})), key=len, reverse=True)
    if not under:
        shown = ", ".join(sorted(roots)[:10])
        return None, f"{destination[:200]} is not under a destination root you may deliver to ({shown})"
    for root in under:
        resolved = _resolved_below(root, destination)
        if resolved is not None:
            return resolved, None
    return None, (f"{destination[:200]} leads out of the destination root {under[0]} through a symbolic link: "
                  "deliveries never follow links below a root")


def destination_refused(*, user, destination):
    """None when `user` may have files delivered to the (normalised) `destination`; else why not."""
    return destination_place(user=user, destination=destination)[1]
