"""Failed logins are limited (django-axes, settings.AXES_*): after AXES_FAILURE_LIMIT failures for
one user name from one address, even the right password is refused until the cool-off has passed,
on the pages' login form and on the admin's; API tokens are never counted nor refused."""
import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.utils import timezone
from rest_framework.authtoken.models import Token


def _fail_until_locked(client, url):
    for _ in range(settings.AXES_FAILURE_LIMIT):
        answer = client.post(url, {"username": "alice", "password": "not-alices"})
    return answer


@pytest.mark.parametrize("url", ["/accounts/login/", "/admin/login/"])
def test_failed_logins_lock_the_account_out_with_a_clear_message(client, alice, url):
    alice.is_staff = True
    alice.save()
    locked = _fail_until_locked(client, url)
    assert locked.status_code == 429
    assert "Too many failed logins" in locked.content.decode()
    # The right password is refused too, until the cool-off.
    again = client.post(url, {"username": "alice", "password": "alice-pw"})
    assert again.status_code == 429 and "_auth_user_id" not in client.session
    # Once the cool-off has passed, the right password logs in.
    AccessAttempt.objects.update(attempt_time=timezone.now() - settings.AXES_COOLOFF_TIME * 2)
    assert client.post(url, {"username": "alice", "password": "alice-pw"}).status_code == 302
    assert client.session["_auth_user_id"] == str(alice.pk)


def test_a_lockout_holds_for_one_name_from_one_address(client, alice, bob):
    _fail_until_locked(client, "/accounts/login/")
    assert client.post("/accounts/login/", {"username": "bob", "password": "bob-pw"}).status_code == 302
    assert client.post("/accounts/login/", {"username": "alice", "password": "alice-pw"},
                       REMOTE_ADDR="192.0.2.7").status_code == 302


@pytest.mark.parametrize("url", ["/accounts/login/", "/admin/login/"])
def test_a_name_longer_than_any_account_is_a_failed_login_not_an_error(db, client, url):
    """axes stores the name of a failed attempt in 255 characters: a longer one was a 500 (issue 25)."""
    name = "x" * 5000
    answers = [client.post(url, {"username": name, "password": "guess"}).status_code
               for _ in range(settings.AXES_FAILURE_LIMIT)]
    assert answers == [200] * (settings.AXES_FAILURE_LIMIT - 1) + [429]
    assert AccessAttempt.objects.get().username == "x" * 255


def test_api_tokens_work_while_the_login_form_is_locked(client, alice):
    _fail_until_locked(client, "/accounts/login/")
    key = Token.objects.create(user=alice).key
    assert client.get("/api/v1/requests/", HTTP_AUTHORIZATION=f"Token {key}").status_code == 200
    assert client.get("/api/v1/requests/", HTTP_AUTHORIZATION=f"Bearer {key}").status_code == 200


def test_behind_trusted_proxies_each_client_is_locked_out_by_its_own_address(client, alice, settings, tmp_path):
    """Behind one proxy (CAROUSEL_TRUSTED_PROXIES=1), every login comes from the proxy's
    REMOTE_ADDR; the client is the address the proxy appended to X-Forwarded-For, and what a
    client wrote there itself changes nothing."""
    from tests.test_deploy import _settings_in

    names = ("AXES_IPWARE_PROXY_COUNT", "AXES_IPWARE_META_PRECEDENCE_ORDER", "IPWARE_STRICT")
    for name, value in _settings_in({"CAROUSEL_VAR_DIR": str(tmp_path), "CAROUSEL_TRUSTED_PROXIES": "1"},
                                    *names).items():
        setattr(settings, name, value)
    proxy = {"REMOTE_ADDR": "10.0.0.2"}
    for _ in range(settings.AXES_FAILURE_LIMIT):
        client.post("/accounts/login/", {"username": "alice", "password": "not-alices"},
                    HTTP_X_FORWARDED_FOR="198.51.100.7", **proxy)
    wrong_again = client.post("/accounts/login/", {"username": "alice", "password": "alice-pw"},
                              HTTP_X_FORWARDED_FOR="198.51.100.7", **proxy)
    assert wrong_again.status_code == 429
    # Forging the header in front of the proxy's entry does not get the attacker out either.
    forged = client.post("/accounts/login/", {"username": "alice", "password": "alice-pw"},
                         HTTP_X_FORWARDED_FOR="203.0.113.99, 198.51.100.7", **proxy)
    assert forged.status_code == 429
    # Another client through the same proxy is not locked out.
    other = client.post("/accounts/login/", {"username": "alice", "password": "alice-pw"},
                        HTTP_X_FORWARDED_FOR="198.51.100.8", **proxy)
    assert other.status_code == 302
    assert set(AccessAttempt.objects.values_list("ip_address", flat=True)) == {"198.51.100.7"}
