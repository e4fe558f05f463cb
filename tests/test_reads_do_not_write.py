"""A GET never changes a row: every address of the API, the Tape REST door, the pages and the
admin, read by each kind of caller on a populated database, issues no INSERT, UPDATE or DELETE.
(Authentication's first-use records are the only writes a GET may make; these callers are all
known already, so none is expected here.)"""
import re

import pytest
from django.apps import apps
from django.db import connection
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.urls.exceptions import NoReverseMatch

from carousel.domain.services import restore_submit
from carousel.loop.cycle import run_cycle
from carousel.models import Bulk, RestoreRequest

from .conftest import client_for, grant_operator_permissions, make_user

WRITE = re.compile(r"^\s*(INSERT|UPDATE|DELETE|TRUNCATE|COPY)\b", re.IGNORECASE)


class Writes:
    def __init__(self):
        self.seen = []

    def __call__(self, execute, sql, params, many, context):
        if WRITE.match(sql):
            self.seen.append(sql.split(" WHERE ")[0][:160])
        return execute(sql, params, many, context)


def patterns(resolvers, prefix=""):
    """(namespaced name, route pattern) of every named address, admin's apart."""
    for entry in resolvers:
        if isinstance(entry, URLResolver):
            if entry.namespace == "admin":
                continue
            ns = f"{prefix}{entry.namespace}:" if entry.namespace else prefix
            yield from patterns(entry.url_patterns, ns)
        elif isinstance(entry, URLPattern) and entry.name:
            yield f"{prefix}{entry.name}", entry.pattern


def addresses(request_id, bulk_id):
    """Every named non-admin address with its parameters filled from the database, plus the
    queries the pages and the API are polled with, and the admin's pages of every model."""
    out = []
    for name, pattern in patterns(get_resolver().url_patterns):
        kwargs = {}
        for param in pattern.regex.groupindex:
            kwargs[param] = bulk_id if (param == "request_id" or "uuid" in str(pattern)) else request_id
        try:
            out.append(reverse(name, kwargs=kwargs))
        except NoReverseMatch:
            out.append(reverse(name, kwargs={k: str(bulk_id) for k in kwargs}))
    out += [f"/api/v1/requests/?bulk={bulk_id}", "/api/v1/requests/?state=queued&page_size=5",
            f"/?bulk={bulk_id}", "/?state=queued", "/api/v1/nothing/here/"]
    for model in apps.get_models():
        info = (model._meta.app_label, model._meta.model_name)
        for view in ("changelist", "add"):
            try:
                out.append(reverse(f"admin:{info[0]}_{info[1]}_{view}"))
            except NoReverseMatch:
                break
        else:
            first = model._default_manager.order_by("pk").values_list("pk", flat=True).first()
            if first is not None:
                for view in ("change", "history", "delete"):
                    out.append(reverse(f"admin:{info[0]}_{info[1]}_{view}", args=[first]))
    return sorted(set(out))


@pytest.fixture
def populated(db, settings, alice, bob, operator, now):
    settings.CAROUSEL_INTAKE_ABOVE = 2  # the big submission below waits in the intake
    restore_submit(user=alice, paths=[f"/star/run1/f{i}" for i in range(2)], now=now)
    restore_submit(user=bob, paths=["/star/run1/f0", "/star/run2/g0"], now=now)
    run_cycle(now=now)  # located, claimed, sent
    run_cycle(now=now)  # restored by the immediate stager
    big = restore_submit(user=alice, paths=[f"/star/run3/h{i}" for i in range(5)], now=now)
    assert Bulk.objects.get(pk=big.bulk.pk).pending == 5
    service = make_user("xrootd", "analysis")
    service.account.acts_for_others = True
    service.account.save()
    return big.bulk


def test_no_get_changes_a_row(populated, alice, bob, operator):
    request_id = RestoreRequest.objects.filter(user=alice).values_list("pk", flat=True).first()
    urls = addresses(request_id, populated.pk)
    assert len(urls) > 40  # the API, the door, the pages and the admin's
    web_alice, web_operator = Client(), Client()
    web_alice.force_login(alice)
    web_operator.force_login(operator)
    callers = {"anonymous": Client(), "alice (web)": web_alice, "operator (web)": web_operator,
               "alice (token)": client_for(alice), "bob (token)": client_for(bob), "operator (token)": client_for(operator)}
    for caller in callers.values():  # first-use records, if any, are written here, not counted
        caller.get("/api/v1/summary/")
    writes = Writes()
    statuses = {}
    with connection.execute_wrapper(writes):
        for who, caller in callers.items():
            for url in urls:
                before = len(writes.seen)
                response = caller.get(url)
                statuses[who, url] = response.status_code
                assert response.status_code < 500, (who, url, response.status_code)
                assert len(writes.seen) == before, (who, url, writes.seen[before:])
    assert writes.seen == []
    assert statuses["alice (token)", f"/api/v1/bulks/{populated.pk}/"] == 200
    # Nothing was settled by reading: the submission's files still wait in the intake.
    assert Bulk.objects.get(pk=populated.pk).pending == 5


def test_a_submissions_counts_show_its_waiting_files_as_queued(populated, alice):
    body = client_for(alice).get(f"/api/v1/bulks/{populated.pk}/").json()
    assert body["states"]["queued"] == 5
    assert Bulk.objects.get(pk=populated.pk).pending == 5
