"""python3-gfal2's bring_online with staging metadata (as FTS sends Rucio's activity) through the
Tape REST door of a live Carousel: the request gets the activity's priority (issue 23)."""
import json
import subprocess

from django.contrib.auth.models import Group
from rest_framework.authtoken.models import Token

from carousel.models import Activity, RestoreRequest
from tests.test_gfal_clients import api_server, pytestmark  # noqa: F401 - the fixture, the skip

PY_GFAL2_STAGE = r"""
import json, sys
import gfal2
surls, metadata = json.loads(sys.argv[1]), sys.argv[2]
ctx = gfal2.creat_context()
errors, token = ctx.bring_online(surls, [metadata] * len(surls), 0, 600, True)
print(json.dumps({"errors": [e and e.message for e in errors], "token": token}))
"""


def test_gfal2_bring_online_carries_the_activity_and_the_request_gets_its_priority(api_server, alice):  # noqa: F811
    Activity.objects.create(group=Group.objects.get(name="analysis"), name="Express", priority=2, weight=3)
    # The API alone: the request's priority is set when it is taken, no cycle is needed.
    url = api_server({"CAROUSEL_TAPE_REST_SITENAME": "BNL-TAPE"})
    token = Token.objects.create(user=alice).key
    surls = [f"{url}/data/express/f{i}" for i in range(2)]
    metadata = json.dumps({"BNL-TAPE": {"activity": "Express"}})

    r = subprocess.run(["/usr/bin/python3", "-c", PY_GFAL2_STAGE, json.dumps(surls), metadata],
                       env={"PATH": "/usr/bin:/bin", "BEARER_TOKEN": token}, capture_output=True, text=True,
                       timeout=120)

    assert r.returncode == 0, r
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["errors"] == [None, None] and out["token"], out
    requests = RestoreRequest.objects.filter(user=alice, path__startswith="/data/express/")
    assert sorted(requests.values_list("path", "activity", "priority")) == [
        ("/data/express/f0", "Express", 2), ("/data/express/f1", "Express", 2)]
    assert requests.first().bulk.activity == "Express"
