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


def test_api_tokens_work_while_the_login_form_is_locked(client, alice):
    _fail_until_locked(client, "/accounts/login/")
    key = Token.objects.create(user=alice).key
    assert client.get("/api/v1/requests/", HTTP_AUTHORIZATION=f"Token {key}").status_code == 200
    assert client.get("/api/v1/requests/", HTTP_AUTHORIZATION=f"Bearer {key}").status_code == 200
