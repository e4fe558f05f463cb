import json
import runpy
from datetime import timedelta

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured

import carousel.settings
from carousel.infra import plugins
from carousel.settings import env_plugins
from carousel.stagers.immediate import ImmediateStager


def settings_from_environment(monkeypatch, **environ):
    """carousel/settings.py run afresh with these environment variables: the settings a process
    started with them would have."""
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    return runpy.run_path(carousel.settings.__file__)


def test_the_configured_stager_is_resolved_once_and_cached(settings):
    assert isinstance(plugins.stager(), ImmediateStager)
    assert plugins.stager() is plugins.stager()


def test_a_site_stager_named_in_settings_is_picked_up(settings):
    settings.CAROUSEL_STAGERS = {**settings.CAROUSEL_STAGERS, "site": "tests.site_plugins.SiteStager"}
    settings.CAROUSEL_STAGER = "site"
    assert type(plugins.stager()).__name__ == "SiteStager"


def test_a_name_that_does_not_resolve_is_a_clear_error(settings):
    settings.CAROUSEL_STAGERS = {"broken": "nowhere.Stager"}
    settings.CAROUSEL_STAGER = "broken"
    with pytest.raises(plugins.PluginError, match=r"CAROUSEL_STAGERS\['broken'\] = 'nowhere.Stager' does not import"):
        plugins.stager()
    ids = {e.id for e in run_checks()}
    assert "carousel.E001" in ids


def test_an_unknown_stager_name_fails_the_system_check(settings):
    settings.CAROUSEL_STAGER = "tape-robot-9000"
    assert "carousel.E002" in {e.id for e in run_checks()}


def test_the_environment_adds_to_a_registry_and_overrides_its_entries(monkeypatch):
    monkeypatch.setenv("CAROUSEL_SORT_POLICIES", '{"NEWEST": "tests.site_plugins.Newest", "NONE": "site.Fifo"}')
    shipped = {"NONE": "policies.sorting.Fifo", "TAPEID": "policies.sorting.TapeId"}
    assert env_plugins("CAROUSEL_SORT_POLICIES", shipped) == {
        "NONE": "site.Fifo", "TAPEID": "policies.sorting.TapeId", "NEWEST": "tests.site_plugins.Newest"}
    monkeypatch.delenv("CAROUSEL_SORT_POLICIES")
    assert env_plugins("CAROUSEL_SORT_POLICIES", shipped) == shipped


@pytest.mark.parametrize("value", ['{"NEWEST": ', '["tests.site_plugins.Newest"]', '{"NEWEST": 3}'])
def test_it_rejects_a_registry_variable_that_is_not_an_object_of_dotted_paths(monkeypatch, value):
    monkeypatch.setenv("CAROUSEL_SHARE_POLICIES", value)
    with pytest.raises(ImproperlyConfigured, match="CAROUSEL_SHARE_POLICIES"):
        env_plugins("CAROUSEL_SHARE_POLICIES", {})


@pytest.mark.parametrize("registry", ["CAROUSEL_STAGERS", "CAROUSEL_DELIVERIES", "CAROUSEL_PATH_AUTHORIZATIONS",
                                      "CAROUSEL_SORT_POLICIES", "CAROUSEL_SHARE_POLICIES", "CAROUSEL_TURN_POLICIES"])
def test_every_plugin_family_is_named_from_the_environment(monkeypatch, registry):
    fresh = settings_from_environment(monkeypatch, **{registry: '{"site": "tests.site_plugins.Anything"}'})
    assert fresh[registry]["site"] == "tests.site_plugins.Anything"
    assert len(fresh[registry]) > 1  # the shipped entries stay


def test_a_delivery_named_in_the_environment_is_the_one_the_loop_uses(monkeypatch, settings, tmp_path):
    from carousel.loop.delivery import DeliveryError

    fresh = settings_from_environment(monkeypatch, CAROUSEL_DELIVERIES='{"link": "tests.site_plugins.Symlink"}',
                                      CAROUSEL_DELIVERY="link")
    settings.CAROUSEL_DELIVERIES, settings.CAROUSEL_DELIVERY = fresh["CAROUSEL_DELIVERIES"], fresh["CAROUSEL_DELIVERY"]
    staged = tmp_path / "staged"
    staged.write_text("data")
    plugins.delivery().deliver(str(staged), str(tmp_path / "mine"), root=str(tmp_path))
    assert (tmp_path / "mine").read_text() == "data" and (tmp_path / "mine").is_symlink()
    with pytest.raises(DeliveryError) as refused:
        plugins.delivery().deliver(str(staged), str(tmp_path / "mine"), root=str(tmp_path))
    assert refused.value.user_error


class EarlierContract:
    """A site's delivery written for deliver(source, destination), before it got its root."""

    def deliver(self, source, destination):
        pass


def test_a_delivery_that_takes_no_root_fails_the_system_check(settings):
    settings.CAROUSEL_DELIVERIES = {**settings.CAROUSEL_DELIVERIES, "old": "tests.test_plugins.EarlierContract"}
    settings.CAROUSEL_DELIVERY = "old"
    assert any(e.id == "carousel.E008" and "takes no root" in e.msg for e in run_checks())
    settings.CAROUSEL_DELIVERY = "copy"
    assert "carousel.E008" not in {e.id for e in run_checks()}


def test_a_registered_name_that_does_not_import_fails_the_system_check(settings):
    settings.CAROUSEL_SHARE_POLICIES = {**settings.CAROUSEL_SHARE_POLICIES, "GONE": "nowhere.Share"}
    assert any(e.id == "carousel.E001" and "GONE" in e.msg for e in run_checks())


def test_a_path_authorisation_that_does_not_resolve_fails_the_system_check(settings):
    settings.CAROUSEL_PATH_AUTHORIZATION = "site.nowhere.Rule"
    assert "carousel.E005" in {e.id for e in run_checks()}


def test_the_admin_offers_the_policies_a_site_named(settings, db):
    from carousel.admin import ControlForm

    settings.CAROUSEL_SORT_POLICIES = {**settings.CAROUSEL_SORT_POLICIES, "NEWEST": "tests.site_plugins.Newest"}
    settings.CAROUSEL_SHARE_POLICIES = {**settings.CAROUSEL_SHARE_POLICIES, "ELDERS": "tests.site_plugins.Elders"}
    form = ControlForm()
    assert [n for n, _ in form.fields["sort_policy"].choices] == ["NEWEST", "NONE", "SLIDER", "TAPEID"]
    assert [n for n, _ in form.fields["share_policy"].choices] == ["ELDERS", "EQUAL", "GROUP", "GRPW"]


def test_a_sorting_and_a_sharing_policy_named_in_the_environment_run_the_cycle(monkeypatch, settings, alice,
                                                                                  charlie, now):
    from carousel.domain.services import restore_submit
    from carousel.loop.cycle import run_cycle
    from carousel.models import Control, RestoreRequest
    from tests.site_plugins import MapStager

    def sent_in_a_cycle(sort, share):
        Control.objects.update_or_create(id=1, defaults={"sort_policy": sort, "share_policy": share,
                                                         "files_per_job": 1, "jobs_in_flight": 2,
                                                         "mount_min_files": 1, "max_wait_s": 3600})
        for user in (alice, charlie):
            for i in range(3):
                restore_submit(user=user, now=now + timedelta(seconds=i), paths=[f"/{user.username}/{i}"])
        stager = MapStager({f"/{u}/{i}": (f"T{u}{i}", 0) for u in ("alice", "charlie") for i in range(3)})
        run_cycle(now=now + timedelta(seconds=10), stager=stager)
        return sorted(p for job in stager.sent for p in job.paths)

    # The shipped pair: each user's oldest file, one each.
    assert sent_in_a_cycle("NONE", "EQUAL") == ["/alice/0", "/charlie/0"]
    RestoreRequest.objects.all().delete()

    fresh = settings_from_environment(
        monkeypatch, CAROUSEL_SORT_POLICIES=json.dumps({"NEWEST": "tests.site_plugins.Newest"}),
        CAROUSEL_SHARE_POLICIES=json.dumps({"ELDERS": "tests.site_plugins.Elders"}))
    settings.CAROUSEL_SORT_POLICIES = fresh["CAROUSEL_SORT_POLICIES"]
    settings.CAROUSEL_SHARE_POLICIES = fresh["CAROUSEL_SHARE_POLICIES"]
    # The site's pair: alice, the elder, takes both slots, her newest files first.
    assert sent_in_a_cycle("NEWEST", "ELDERS") == ["/alice/1", "/alice/2"]


# A stager whose options it refuses: `check` fails at start, and a cycle reports it down ---------

@pytest.mark.parametrize("stager, options, says", [
    ("tape-rest", {}, "url"),
    ("tape-rest", {"url": "tape.example.org:8443"}, "url must be"),
    ("simulated", {"media": "LTO-99"}, "unknown media"),
    ("hpss", {"hsi": "/usr/bin/hsi", "no_such_option": 1}, "no_such_option"),
    ("command", {"locate": "/opt/site/locate"}, "stage"),
])
def test_a_stager_that_refuses_its_options_fails_the_system_check(settings, stager, options, says):
    settings.CAROUSEL_STAGER, settings.CAROUSEL_STAGER_OPTIONS = stager, options
    errors = [e for e in run_checks() if e.id == "carousel.E007"]
    assert len(errors) == 1 and says in errors[0].msg and f"CAROUSEL_STAGER={stager!r}" in errors[0].msg


def test_the_configured_stager_with_good_options_passes_the_check(settings):
    settings.CAROUSEL_STAGER, settings.CAROUSEL_STAGER_OPTIONS = "tape-rest", {"url": "https://tape.example.org"}
    assert "carousel.E007" not in {e.id for e in run_checks()}


def test_manage_py_check_fails_on_tape_rest_without_its_url(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if not k.startswith(("CAROUSEL_", "DATABASE_URL", "REDIS_URL"))}
    env.update(CAROUSEL_STAGER="tape-rest", CAROUSEL_VAR_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "manage.py", "check"], cwd=Path(__file__).resolve().parent.parent,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "carousel.E007" in done.stderr and "'url'" in done.stderr, done.stderr


def test_a_cycle_reports_a_stager_that_cannot_be_built_as_down_with_the_reason(settings, db, now, caplog):
    from carousel.loop.cycle import run_cycle
    from carousel.models import Control, StagerHealth

    settings.CAROUSEL_STAGER, settings.CAROUSEL_STAGER_OPTIONS = "tape-rest", {}
    report = run_cycle(now=now)
    health = StagerHealth.get()
    assert report.health == health.state == "down"
    assert "cannot be built" in health.reason and "'url'" in health.reason
    assert Control.get().last_cycle_error == report.error and "'url'" in report.error
    assert not any(record.exc_info for record in caplog.records)  # a reason, not a traceback
