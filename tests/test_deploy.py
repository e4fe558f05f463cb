"""A deployment safe on day one: the compose file, the loop's refusal of a faking stager, the
settings for a TLS proxy, the account commands, the demo accounts' refusal, the notice of a
simulated library on every page."""
import json
import os
import re
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
import yaml
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.test import Client
from rest_framework.authtoken.models import Token

from carousel.models import Account, GroupShare

ROOT = Path(__file__).resolve().parent.parent
LOOP_SERVICES = ("web", "worker", "delivery", "beat", "migrate")


def _clean_env(**extra):
    """The environment without the test servers' and the operator's settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CAROUSEL_", "DATABASE_URL", "REDIS_URL",
                                                                     "CSRF_", "SECURE_"))}
    env.update(extra)
    return env


def test_compose_file_is_valid_with_a_stager_that_reads_tape_by_default_and_var_as_a_volume():
    out = subprocess.run(["docker-compose", "-f", str(ROOT / "docker-compose.yml"), "config"],
                         env=_clean_env(SECRET_KEY="compose-test"), capture_output=True, text=True, check=True)
    config = yaml.safe_load(out.stdout)
    for name in LOOP_SERVICES:
        env = config["services"][name]["environment"]
        assert env["CAROUSEL_STAGER"] == "simulated", name
        assert env["CAROUSEL_ALLOW_IMMEDIATE"] in ("0", 0, "", None), name
        assert any(v.startswith(f"carousel-var:{env['CAROUSEL_VAR_DIR']}") for v in config["services"][name]["volumes"])
    assert "carousel-var" in config["volumes"]
    # One beat only.
    assert [n for n, s in config["services"].items() if " beat" in str(s.get("command"))] == ["beat"]


def _celery(role, tmp_path, **env):
    cmd = [sys.executable, "-m", "celery", "-A", "carousel", role, "--loglevel=WARNING"]
    cmd += ["--pool=solo", "-Q", "celery"] if role == "worker" else ["-s", str(tmp_path / "beat-schedule")]
    # cwd: kombu's filesystem transport makes a control/ folder where it runs.
    return subprocess.run(cmd, env=_clean_env(CAROUSEL_VAR_DIR=str(tmp_path), PYTHONPATH=str(ROOT), **env),
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("role", ["worker", "beat"])
def test_the_loop_refuses_to_start_on_the_immediate_stager(role, tmp_path):
    result = _celery(role, tmp_path, CAROUSEL_STAGER="immediate")
    assert result.returncode == 2
    assert "refuses to start" in result.stdout + result.stderr


def test_the_loop_starts_on_immediate_when_told_explicitly(settings):
    from carousel.infra.deploy import check_loop_stager
    from django.core.exceptions import ImproperlyConfigured

    settings.CAROUSEL_STAGER = "immediate"
    settings.CAROUSEL_ALLOW_IMMEDIATE = False
    with pytest.raises(ImproperlyConfigured):
        check_loop_stager()
    settings.CAROUSEL_ALLOW_IMMEDIATE = True
    check_loop_stager()
    settings.CAROUSEL_STAGER = "simulated"
    settings.CAROUSEL_ALLOW_IMMEDIATE = False
    check_loop_stager()


def _settings_in(env, *names):
    code = ("import json, django; from django.conf import settings; django.setup(); "
            f"print(json.dumps({{n: getattr(settings, n, None) for n in {list(names)!r}}}, default=str))")
    out = subprocess.run([sys.executable, "-c", code], env=_clean_env(DJANGO_SETTINGS_MODULE="carousel.settings",
                                                                      **env),
                         cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_proxy_settings_come_from_the_environment(tmp_path):
    names = ("CSRF_TRUSTED_ORIGINS", "SECURE_PROXY_SSL_HEADER", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE")
    default = _settings_in({"CAROUSEL_VAR_DIR": str(tmp_path)}, *names)
    assert default == {"CSRF_TRUSTED_ORIGINS": [], "SECURE_PROXY_SSL_HEADER": None, "SESSION_COOKIE_SECURE": False,
                       "CSRF_COOKIE_SECURE": False}
    proxied = _settings_in({"CAROUSEL_VAR_DIR": str(tmp_path),
                            "CSRF_TRUSTED_ORIGINS": "https://carousel.example.org, https://tape.example.org",
                            "SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto: https", "SECURE_COOKIES": "1"}, *names)
    assert proxied == {"CSRF_TRUSTED_ORIGINS": ["https://carousel.example.org", "https://tape.example.org"],
                       "SECURE_PROXY_SSL_HEADER": ["HTTP_X_FORWARDED_PROTO", "https"],
                       "SESSION_COOKIE_SECURE": True, "CSRF_COOKIE_SECURE": True}


def test_trusted_proxies_come_from_the_environment(tmp_path):
    names = ("AXES_IPWARE_PROXY_COUNT", "AXES_IPWARE_META_PRECEDENCE_ORDER")
    assert _settings_in({"CAROUSEL_VAR_DIR": str(tmp_path)}, *names) == {
        "AXES_IPWARE_PROXY_COUNT": None, "AXES_IPWARE_META_PRECEDENCE_ORDER": ["REMOTE_ADDR"]}
    assert _settings_in({"CAROUSEL_VAR_DIR": str(tmp_path), "CAROUSEL_TRUSTED_PROXIES": "2"}, *names) == {
        "AXES_IPWARE_PROXY_COUNT": 1, "AXES_IPWARE_META_PRECEDENCE_ORDER": ["HTTP_X_FORWARDED_FOR"]}


def test_a_form_post_through_a_tls_proxy_passes_the_csrf_check(settings, alice):
    settings.ALLOWED_HOSTS = ["carousel.example.org"]
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    proxy = {"HTTP_HOST": "carousel.example.org", "HTTP_X_FORWARDED_PROTO": "https",
             "HTTP_ORIGIN": "https://carousel.example.org", "HTTP_REFERER": "https://carousel.example.org/accounts/login/"}

    def login():
        client = Client(enforce_csrf_checks=True)
        page = client.get("/accounts/login/", **proxy)
        token = page.cookies["csrftoken"].value
        return client.post("/accounts/login/", {"username": "alice", "password": "alice-pw",
                                                "csrfmiddlewaretoken": token}, **proxy)

    settings.CSRF_TRUSTED_ORIGINS = []
    # The proxy's header says the client spoke HTTPS: the https Origin is this site's own.
    assert login().status_code == 302
    # Without SECURE_PROXY_SSL_HEADER the request looks like plain HTTP from an https origin:
    # every form POST is refused (the day-one failure).
    settings.SECURE_PROXY_SSL_HEADER = None
    assert login().status_code == 403
    # CSRF_TRUSTED_ORIGINS alone lets that origin through.
    settings.CSRF_TRUSTED_ORIGINS = ["https://carousel.example.org"]
    assert login().status_code == 302


def test_user_group_token_commands_are_idempotent_and_scriptable(db, monkeypatch):
    call_command("group", "cms", "--weight", "3")
    call_command("group", "cms", "--weight", "3")
    call_command("group", "atlas")
    assert GroupShare.objects.get(group__name="cms").weight == 3.0
    monkeypatch.setenv("PW", "s3cret")
    out = StringIO()
    call_command("user", "dana", "--group", "cms", "--group", "atlas", "--email", "d@example.org",
                 "--password-env", "PW", "--token", stdout=out)
    token = out.getvalue().strip()
    again = StringIO()
    call_command("user", "dana", "--group", "cms", "--group", "atlas", "--password-env", "PW", "--token",
                 stdout=again)
    assert again.getvalue().strip() == token == Token.objects.get(user__username="dana").key
    dana = User.objects.get(username="dana")
    assert sorted(dana.groups.values_list("name", flat=True)) == ["atlas", "cms"]
    assert Account.objects.get(user=dana).group.name == "cms"
    assert dana.check_password("s3cret") and dana.email == "d@example.org" and not dana.is_staff
    assert User.objects.filter(username="dana").count() == 1
    # Exactly the groups given: a later call moves the user.
    call_command("user", "dana", "--group", "atlas")
    assert list(dana.groups.values_list("name", flat=True)) == ["atlas"]
    assert Account.objects.get(user=dana).group.name == "atlas"
    # The token command prints the same token; --rotate replaces it.
    out = StringIO()
    call_command("token", "dana", stdout=out)
    assert out.getvalue().strip() == token
    out = StringIO()
    call_command("token", "dana", "--rotate", stdout=out)
    assert out.getvalue().strip() != token and not Token.objects.filter(key=token).exists()
    # A user made without a password logs in with its token only.
    call_command("user", "svc")
    assert not User.objects.get(username="svc").has_usable_password()
    with pytest.raises(CommandError, match="no such group: nope"):
        call_command("user", "erin", "--group", "nope")
    assert not User.objects.filter(username="erin").exists()  # nothing half stored
    with pytest.raises(CommandError, match="no such user"):
        call_command("token", "nobody")


@pytest.mark.parametrize("command, says", [
    (["group", "gy", "--weight", "inf"], "weight must be a number greater than 0"),
    (["group", "gx", "--weight", "nan"], "weight must be a number greater than 0"),
    (["group", "gz", "--weight", "0"], "weight must be a number greater than 0"),
    (["group", "gz", "--weight", "1e300"], "at most 1,000,000"),  # two such were infinity (a probe)
    (["group", ""], "a group's name must be"),
    (["group", "tab\there"], "a group's name must be"),
    (["group", "g" * 151], "a group's name must be"),
    (["group", "gw", "--inflight-cap", "-5"], "--inflight-cap must be from 0 to 2,147,483,647, got -5"),
    (["group", "gw", "--inflight-cap", "2147483648"], "--inflight-cap must be from 0 to 2,147,483,647"),
    (["user", ""], "a user name must be"),
    (["user", "has space"], "Enter a valid username"),
    (["user", "u" * 151], "a user name must be"),
    (["user", "u1", "--email", "notanemail"], "Enter a valid email address"),
    (["user", "u1", "--inflight-cap", "-3"], "--inflight-cap must be from 0 to 2,147,483,647"),
    (["user", "u1", "--queued-ceiling", "-1"], "--queued-ceiling must be from 0 to 2,147,483,647"),
    # Past the column's range: a traceback (a probe's finding).
    (["user", "u1", "--queued-ceiling", "99999999999999999999999"], "--queued-ceiling must be from 0 to"),
])
def test_the_account_commands_refuse_what_the_admin_refuses_and_store_nothing(db, command, says):
    """`group gy --weight inf` was stored and stopped every cycle once its users had work; nan,
    a negative cap, an empty or 300-character name, a name with a space or a tab and a bad e-mail
    address were stored or gave a traceback."""
    from django.contrib.auth.models import Group

    with pytest.raises(CommandError, match=re.escape(says)):
        call_command(*command)
    assert not Group.objects.exists() and not User.objects.exists()


def test_the_token_from_the_command_authenticates_the_api(db):
    out = StringIO()
    call_command("user", "frank", "--token", stdout=out)
    client = Client()
    assert client.get("/api/v1/summary/", HTTP_AUTHORIZATION=f"Token {out.getvalue().strip()}").status_code == 200


def test_demo_accounts_are_refused_outside_the_embedded_default(db):
    # The test database is PostgreSQL: not the embedded default.
    with pytest.raises(CommandError, match="refusing to create the demo accounts"):
        call_command("demo", "--no-requests")
    assert not User.objects.filter(username="operator").exists()
    call_command("demo", "--no-requests", "--any-database", stdout=StringIO())
    assert User.objects.get(username="operator").is_superuser


def test_the_embedded_default_is_recognised(tmp_path):
    code = "import django; django.setup(); from carousel.infra.deploy import is_embedded_database as e; print(e())"
    run = lambda **env: subprocess.run(  # noqa: E731
        [sys.executable, "-c", code], env=_clean_env(DJANGO_SETTINGS_MODULE="carousel.settings",
                                                     CAROUSEL_VAR_DIR=str(tmp_path), **env),
        cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    assert run() == "True"
    assert run(DATABASE_URL=f"sqlite:///{tmp_path}/other.sqlite3") == "False"
    assert run(DATABASE_URL="postgres://carousel@127.0.0.1:1/carousel") == "False"


# Three requests' worth of what Django's handlers do around a view (the signals close the
# connections that are too old), with a query each; the connections opened.
REQUESTS_ON_ONE_CONNECTION = """
import django; django.setup()
from django.core.signals import request_finished, request_started
from django.db import connection
from django.db.backends.signals import connection_created
opened = []
connection_created.connect(lambda **kwargs: opened.append(1), weak=False)
for _ in range(3):
    request_started.send(sender=None)
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    request_finished.send(sender=None)
print(len(opened))
"""


def test_the_embedded_default_keeps_its_connection_between_requests(tmp_path):
    """Opening the SQLite file was a fifth of a web worker's CPU under schemathesis (settings.py)."""
    run = lambda **env: subprocess.run(  # noqa: E731
        [sys.executable, "-c", REQUESTS_ON_ONE_CONNECTION],
        env=_clean_env(DJANGO_SETTINGS_MODULE="carousel.settings", CAROUSEL_VAR_DIR=str(tmp_path), **env),
        cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    assert run() == "1"
    assert run(CONN_MAX_AGE="0") == "3"  # as documented: a connection per request

@pytest.mark.parametrize("stager, shown", [("simulated", True), ("hpss", False)])
def test_every_page_says_when_the_library_is_simulated(settings, client, operator, stager, shown):
    settings.CAROUSEL_STAGER = stager
    client.force_login(operator)
    for url in ("/", "/restore/", "/live/", "/admin/", "/accounts/login/"):
        page = client.get(url).content.decode()
        assert ("Simulated tape library" in page) is shown, url


# Production (PostgreSQL) refuses the published secret key, DEBUG on and no allowed hosts ----------

def _problems(**given):
    from carousel.infra.deploy import production_problems

    setup = dict(vendor="postgresql", secret_key="a-site-secret", embedded_secret_key="embedded", debug=False,
                 allowed_hosts=["carousel.example.org"])
    return production_problems(**{**setup, **given})


@pytest.mark.parametrize("given, says", [
    ({"secret_key": "embedded"}, "Set SECRET_KEY"),
    ({"debug": True}, "Unset DEBUG"),
    ({"allowed_hosts": []}, "Set ALLOWED_HOSTS"),
])
def test_production_refuses_each_unsafe_setting_and_says_what_to_set(given, says):
    assert _problems() == []
    problems = _problems(**given)
    assert len(problems) == 1 and says in problems[0]


def test_the_embedded_default_runs_as_shipped():
    assert _problems(vendor="sqlite", secret_key="embedded", debug=True, allowed_hosts=[]) == []


def test_the_system_check_fires_on_postgresql_with_the_published_key(settings):
    from django.core.checks import run_checks

    assert "carousel.E006" not in {e.id for e in run_checks()}
    settings.SECRET_KEY = settings.EMBEDDED_SECRET_KEY
    settings.ALLOWED_HOSTS = []
    errors = [e for e in run_checks() if e.id == "carousel.E006"]
    assert len(errors) == 2 and "SECRET_KEY" in errors[0].msg and "ALLOWED_HOSTS" in errors[1].msg


def _without_secret(**env):
    env = _clean_env(DATABASE_URL=os.environ["DATABASE_URL"], **env)
    env.pop("SECRET_KEY", None)
    return env


def test_migrate_refuses_to_start_on_postgresql_with_the_published_key(tmp_path):
    done = subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=ROOT, capture_output=True,
                          text=True, env=_without_secret(CAROUSEL_VAR_DIR=str(tmp_path)), timeout=120)
    assert done.returncode != 0 and "carousel.E006" in done.stderr and "Set SECRET_KEY" in done.stderr, done.stderr


def test_gunicorns_application_and_the_worker_refuse_the_published_key(tmp_path):
    wsgi = subprocess.run([sys.executable, "-c", "import carousel.wsgi"], cwd=ROOT, capture_output=True, text=True,
                          env=_without_secret(CAROUSEL_VAR_DIR=str(tmp_path)), timeout=60)
    assert wsgi.returncode != 0 and "Set SECRET_KEY" in wsgi.stderr, wsgi.stderr
    worker = _celery("worker", tmp_path, DATABASE_URL=os.environ["DATABASE_URL"], SECRET_KEY="",
                     CAROUSEL_STAGER="simulated")
    assert worker.returncode == 2 and "Set SECRET_KEY" in worker.stderr, worker.stderr


# Every setting the README documents reaches the compose file's processes ------------------------

def readme_settings():
    """The environment variables named in the first column of the README's configuration table."""
    import re

    text = (ROOT / "README.md").read_text()
    table = text.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    names = set()
    for line in table.splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([A-Z][A-Z0-9_]+)`", line.split("|")[1]))
    return names


def test_the_compose_file_passes_through_every_setting_the_readme_documents():
    documented = readme_settings()
    assert {"SECRET_KEY", "DEBUG", "EMAIL_HOST", "EMAIL_HOST_PASSWORD", "DEFAULT_FROM_EMAIL",
            "CAROUSEL_WLCG_ISSUERS"} <= documented
    out = subprocess.run(["docker-compose", "-f", str(ROOT / "docker-compose.yml"), "config"],
                         env=_clean_env(SECRET_KEY="compose-test", EMAIL_HOST="smtp.example.org", CAROUSEL_TICK_S="5"),
                         capture_output=True, text=True, check=True)
    services = yaml.safe_load(out.stdout)["services"]
    for name in LOOP_SERVICES:
        assert documented - set(services[name]["environment"]) == set(), name
    # What the operator sets reaches the processes; what it leaves unset stays unset (the default).
    env = services["worker"]["environment"]
    assert env["EMAIL_HOST"] == "smtp.example.org" and str(env["CAROUSEL_TICK_S"]) == "5"
    assert env["CAROUSEL_TOKEN_CACHE_SECONDS"] is None


def test_email_settings_come_from_the_environment(monkeypatch):
    from tests.test_plugins import settings_from_environment

    embedded = settings_from_environment(monkeypatch)
    assert embedded["EMAIL_BACKEND"] == "django.core.mail.backends.console.EmailBackend"
    configured = settings_from_environment(
        monkeypatch, EMAIL_HOST="smtp.example.org", EMAIL_PORT="587", EMAIL_USE_TLS="1", EMAIL_HOST_USER="carousel",
        EMAIL_HOST_PASSWORD="s3cret", DEFAULT_FROM_EMAIL="Carousel <carousel@example.org>")
    assert configured["EMAIL_BACKEND"] == "django.core.mail.backends.smtp.EmailBackend"
    assert (configured["EMAIL_HOST"], configured["EMAIL_PORT"], configured["EMAIL_USE_TLS"],
            configured["EMAIL_USE_SSL"]) == ("smtp.example.org", 587, True, False)
    assert (configured["EMAIL_HOST_USER"], configured["EMAIL_HOST_PASSWORD"]) == ("carousel", "s3cret")
    assert configured["DEFAULT_FROM_EMAIL"] == "Carousel <carousel@example.org>"
    monkeypatch.setenv("EMAIL_USE_SSL", "1")
    with pytest.raises(ImproperlyConfigured, match="exclusive"):
        settings_from_environment(monkeypatch)
