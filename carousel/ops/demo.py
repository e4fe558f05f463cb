"""Demo accounts and requests for `make run`, and the embedded-default smoke run."""
from django.contrib.auth.models import Group, User
from rest_framework.authtoken.models import Token

from carousel.models import Account, GroupShare
from carousel.domain.services import restore_submit

DEMO_GROUPS = {"production": 3.0, "analysis": 1.0}
# username -> (group, staff)
DEMO_USERS = {"alice": ("analysis", False), "bob": ("analysis", False), "charlie": ("production", False),
              "operator": ("production", True)}


def demo_password(username):
    return f"{username}-demo"


def demo_accounts():
    """Create the demo groups and users once; return [(username, password, token, staff)]."""
    groups = {}
    for name, weight in DEMO_GROUPS.items():
        groups[name], _ = Group.objects.get_or_create(name=name)
        GroupShare.objects.get_or_create(group=groups[name], defaults={"weight": weight})
    out = []
    for username, (group, staff) in DEMO_USERS.items():
        # An address, so that completion notices show on the console under `make run`.
        user, created = User.objects.get_or_create(username=username, defaults={
            "is_staff": staff, "is_superuser": staff, "email": f"{username}@example.org"})
        if created:
            user.set_password(demo_password(username))
            user.save()
            user.groups.add(groups[group])
            Account.objects.update_or_create(user=user, defaults={"group": groups[group]})
        token, _ = Token.objects.get_or_create(user=user)
        out.append((username, demo_password(username), token.key, staff))
    return out


def demo_requests(*, now):
    """A production campaign and a few analysts' files, so the loop has work to show."""
    charlie = User.objects.get(username="charlie")
    if charlie.restore_requests.exists():
        return 0
    restore_submit(user=charlie, now=now,
                   paths=[f"/star/raw/run{r:03d}/st_physics_{r:03d}_{i:04d}.daq" for r in range(8) for i in range(40)])
    for name, n in (("alice", 5), ("bob", 3)):
        restore_submit(user=User.objects.get(username=name), now=now,
                       paths=[f"/star/analysis/{name}/picoDst_{i:03d}.root" for i in range(n)])
    return 328
