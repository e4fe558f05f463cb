import os

import pytest
from django.contrib.auth.models import Group, User
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from carousel.models import Account, GroupShare


def pytest_configure(config):
    # The suite runs against real servers; `make test` starts them (carousel/infra/localservices.py).
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        raise pytest.UsageError("tests need PostgreSQL: run `make test`, or set DATABASE_URL and REDIS_URL")
    # Before any user is made (tests/hashers.py says why); only this process: the servers a
    # test starts keep the shipped hashers, which verify these hashes too.
    from django.conf import settings

    settings.PASSWORD_HASHERS = ["tests.hashers.OneRoundPBKDF2", *settings.PASSWORD_HASHERS]
    # WhiteNoise walks every static file the finders know (the admin's, DRF's, the pages') each
    # time its middleware is built, and Django's test clients build the middleware anew for each
    # client: loading the middleware took 38 ms, 0.4 ms without the walk. Looking a file up when it is
    # asked for (WhiteNoise's development mode) serves the same files; only this process: the
    # servers a test starts keep the shipped setting.
    settings.WHITENOISE_AUTOREFRESH = True


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix):
    """Each process's test database is made from a database migrated once a run (Django's TEST
    TEMPLATE setting; tests/databases.py): pytest-django's migrate then finds every migration
    applied, instead of each xdist worker migrating an empty database of its own."""
    from django.conf import settings

    from tests.databases import migrated_postgresql

    settings.DATABASES["default"].setdefault("TEST", {})["TEMPLATE"] = migrated_postgresql()


@pytest.fixture(autouse=True)
def _eager_celery(settings):
    # Tasks fired by views (withdrawals at the stager) run inline here; the loop's own worker
    # tests start a real worker instead.
    from carousel.celery import app

    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = False


@pytest.fixture(autouse=True)
def _immediate_stager(settings):
    # Tests that run the loop without naming a stager get the one that restores at the next
    # poll; the simulated library is tested where it is the point (test_library, test_replay,
    # the real worker of test_worker).
    settings.CAROUSEL_STAGER = "immediate"


@pytest.fixture
def now():
    return timezone.now()


def make_user(username, group=None, staff=False):
    user = User.objects.create_user(username, password=f"{username}-pw", is_staff=staff)
    if group:
        grp, _ = Group.objects.get_or_create(name=group)
        GroupShare.objects.get_or_create(group=grp)
        user.groups.add(grp)
        Account.objects.create(user=user, group=grp)
    return user


@pytest.fixture
def alice(db):
    return make_user("alice", "analysis")


@pytest.fixture
def bob(db):
    return make_user("bob", "analysis")


@pytest.fixture
def charlie(db):
    return make_user("charlie", "production")


def grant_operator_permissions(user):
    """An operator's powers are Django permissions (view and change on Carousel's models), not
    is_staff: the API and the admin follow them."""
    from django.contrib.auth.models import Permission

    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="carousel",
                                                         codename__regex=r"^(view|change)_"))
    return user


@pytest.fixture
def operator(db):
    return grant_operator_permissions(make_user("operator", "production", staff=True))


@pytest.fixture
def library_speedup():
    """How many times faster than life the live tests' simulated library runs (tests/live.py's
    `carousel`; a module may override it)."""
    return 2000


@pytest.fixture
def as_staff(client, operator):
    """The admin's pages as the operator with every power (a superuser)."""
    operator.is_superuser = True
    operator.save()
    client.force_login(operator)
    return client


@pytest.fixture
def staffer(db):
    """A staff account holding no permission at all: it may log in to the admin, nothing more."""
    return make_user("staffer", "production", staff=True)


def client_for(user):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.get_or_create(user=user)[0].key}")
    return client


@pytest.fixture
def as_alice(alice):
    return client_for(alice)


@pytest.fixture
def as_bob(bob):
    return client_for(bob)


@pytest.fixture
def as_operator(operator):
    return client_for(operator)


def a_backend_waits_for_a_lock(timeout=10.0):
    """Whether, within `timeout` s, a connection to this test database waits for a lock (another
    thread's statement blocked on a row this test holds). The statistics views are read anew
    each time: within a transaction PostgreSQL would keep showing the first reading."""
    import time

    from django.db import connection

    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                           "AND datname = current_database()")
            if cursor.fetchone()[0]:
                return True
            time.sleep(0.05)
    return False
