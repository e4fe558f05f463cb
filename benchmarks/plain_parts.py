"""Each hand-made part of issue 22 ("Hand-made parts replaced or made plain") against what
replaced it, both timed in one process, in alternating rounds (a shared machine drifts).

    .venv/bin/python -m carousel.infra.localservices -- .venv/bin/python benchmarks/plain_parts.py list update cache token
    (--before names the commit whose code is "before"; default f444372, the base of branch h-plain)

"before" is the module as it was at --before, read with `git show` and loaded beside the
current one; "after" is the working tree. Each part checks that both give the same answer
before it times them. Prints, per part, the median over --rounds rounds of the mean wall time
of one call, and its mean CPU time (this process and its PostgreSQL backend: the machine may
be shared); the last line is JSON."""
import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingest import ROOT, setup_django  # noqa: E402

BEFORE = "f444372"  # the base of branch h-plain: every part still hand-made


def load_before(ref, path, name):
    """The module at `path` as it was at commit `ref`, imported under `name`."""
    source = subprocess.run(["git", "show", f"{ref}:{path}"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout
    spec = importlib.util.spec_from_loader(name, loader=None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    exec(compile(source, f"{ref}:{path}", "exec"), module.__dict__)
    return module


def _cpu_s():
    """CPU seconds used so far by this process and by its PostgreSQL backend: what the calls
    cost the machine, whatever else shares it (wall times grow with the machine's load)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]
    with open(f"/proc/{backend}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return time.process_time() + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def compare(named, rounds, calls, reset=None):
    """{name: ms, name_cpu: ms} per call: the median over `rounds` of each function's mean wall
    time over `calls` calls, and its CPU time (this process and its PostgreSQL backend) over
    all rounds; the functions take turns within each round, in the opposite order every other
    round. `reset`, if given, runs (untimed) before each function's turn."""
    times = {name: [] for name in named}
    cpu = dict.fromkeys(named, 0.0)
    for round_ in range(rounds):
        for name, fn in (list(named.items()) if round_ % 2 == 0 else reversed(named.items())):
            if reset:
                reset()
            cpu_start = _cpu_s()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - start) / calls * 1000)
            cpu[name] += _cpu_s() - cpu_start
    result = {}
    for name in named:
        result[name] = round(statistics.median(times[name]), 3)
        result[f"{name}_cpu"] = round(cpu[name] / (rounds * calls) * 1000, 3)
    return result


def part_list(args):
    """One page of the request list (100 requests, state=queued, newest first) as the view
    makes it: the query, the rows' rendering and the JSON."""
    from django.contrib.auth import get_user_model
    from rest_framework.renderers import JSONRenderer

    from api import serializers as after
    from carousel.domain import selectors
    from load import BIG, fill

    fill(args.queued)
    before = load_before(args.before, "api/serializers.py", "serializers_before")
    qs = selectors.request_list(user=get_user_model().objects.get(username=BIG), state=["queued"]).order_by("-id")
    render = JSONRenderer().render

    def hand_made():  # PlainFieldsFirst: DRF's field rules re-implemented through its private attributes
        serializer = before.RequestSerializer()  # one per request, as the view made it
        names, annotations = serializer.row_query()
        return render(serializer.rows_representation(list(qs.values(*names, **annotations)[:100])))

    def plain():  # request_list_values and request_list_data: one explicit function
        return render(after.request_list_data(list(after.request_list_values(qs)[:100])))

    def drf():  # DRF's generic ModelSerializer over model instances: no fast path at all
        return render(after.RequestSerializer(list(qs.select_related("tape", "user")[:100]), many=True).data)

    assert hand_made() == plain() == drf(), "the three renderings differ"
    return compare({"before_hand_made": hand_made, "after_plain": plain, "drf_generic": drf}, args.rounds, args.calls)


def rolled_back(fn):
    """fn, its changes undone: every call of it finds the same rows."""
    from django.db import transaction

    def call():
        with transaction.atomic():
            result = fn()
            transaction.set_rollback(True)
        return result
    return call


def part_update(args):
    """A cycle's claim: --claimed queued requests (of --queued) move to SUBMITTED, each taking
    its job and rank, in one UPDATE joining the list (with the table's triggers); and the
    same number of pending jobs taking their file counts and estimates."""
    import random
    from django.db import connection
    from django.db.models import F
    from django.utils import timezone

    from carousel.domain import services
    from carousel.infra import db as after
    from carousel.models import ALLOWED_FROM, Job, JobState, RequestState as S, RestoreRequest
    from load import fill

    fill(args.queued)
    before = load_before(args.before, "carousel/infra/db.py", "db_before")
    now = timezone.now()
    keys = random.Random(1).sample(list(RestoreRequest.objects.filter(state=S.QUEUED).values_list(
        "path_key", flat=True)), args.claimed)
    Job.objects.bulk_create([Job(created_at=now) for _ in range(args.claimed)])
    jobs = list(Job.objects.filter(state=JobState.PENDING).values_list("id", flat=True)[:args.claimed])
    placed = [(key, jobs[i % len(jobs)], i) for i, key in enumerate(keys)]
    counts = [(job, 7, 12.5) for job in jobs]

    def claim_before():  # request_transition(..., joined=...) at f444372
        queryset = RestoreRequest.objects.filter(state=S.QUEUED).filter(state__in=ALLOWED_FROM[S.SUBMITTED])
        return before.update_joined(queryset, ("path_key",), ("job_id", "job_rank"), placed, state=S.SUBMITTED,
                                    updated_at=now, submitted_at=now, attempts=F("attempts") + 1)

    def claim_after():
        return services.request_claim(placed, now=now)

    def jobs_before():
        return before.update_joined(Job.objects.filter(state=JobState.PENDING), ("id",), ("files", "estimate_s"), counts)

    def jobs_after():
        return after.update_joined(Job, counts, on=("id",), columns=("files", "estimate_s"),
                                   where={"state": JobState.PENDING})

    named = {name: rolled_back(fn) for name, fn in [("claim_before", claim_before), ("claim_after", claim_after),
                                                    ("jobs_before", jobs_before), ("jobs_after", jobs_after)]}
    assert named["claim_before"]() == named["claim_after"]() == args.claimed
    assert named["jobs_before"]() == named["jobs_after"]() == len(jobs)

    def vacuum():  # the dead rows of the rolled-back UPDATEs, which the next ones would walk past
        with connection.cursor() as cursor:
            cursor.execute("VACUUM carousel_restorerequest, carousel_job")

    return compare(named, args.rounds, max(1, args.calls // 10), reset=vacuum)


def part_cache(args):
    """The shared cache on Redis, per call of a poll: the token's look-up (a GET of a pickled
    token with its user) and the throttle's count (INCR and EXPIRE in one pipeline)."""
    from django.conf import settings
    from django_redis.cache import RedisCache
    from rest_framework.authtoken.models import Token

    from api.throttles import AccountRateThrottle
    from load import fill

    big_token, _ = fill(1000)
    location, params = os.environ["REDIS_URL"], {"KEY_PREFIX": "carousel"}
    assert settings.CACHES["default"]["BACKEND"] == "django_redis.cache.RedisCache"
    hand_made = load_before(args.before, "carousel/infra/cache.py", "cache_before").RedisCache(location, params)
    throttles_before = load_before(args.before, "api/throttles.py", "throttles_before")
    django_redis = RedisCache(location, params)
    token = Token.objects.select_related("user").get(key=big_token)
    hand_made.set("bench-token", token)
    django_redis.set("bench-token", token)
    assert hand_made.get("bench-token") == django_redis.get("bench-token") == token

    before_throttle = throttles_before.AccountRateThrottle()
    before_throttle.cache = hand_made  # its Redis path, on its own backend
    after_throttle = AccountRateThrottle()  # the default cache: django-redis (settings.CACHES)
    assert before_throttle.count("bench-count") + 1 == after_throttle.count("bench-count")
    return compare({"get_before": lambda: hand_made.get("bench-token"),
                    "get_after": lambda: django_redis.get("bench-token"),
                    "throttle_before": lambda: before_throttle.count("bench-count"),
                    "throttle_after": lambda: after_throttle.count("bench-count")}, args.rounds, args.calls * 10)


def part_token(args):
    """An API token's look-up when it is cached (every poll after the first): f444372's, kept
    until a signal forgets it, against the current one, which reads the state of the rows it
    depends on first; and with no cache at all, what a list poll pays (DRF's query for the token
    and its user, ModelBackend's two for the permissions, and whether it acts for others)."""
    from rest_framework.authentication import TokenAuthentication

    from api.authentication import CachedTokenAuthentication
    from carousel.domain.selectors import acts_for_others
    from load import fill

    key, _ = fill(1000)
    signalled = load_before(args.before, "api/authentication.py", "authentication_before").CachedTokenAuthentication()
    stamped = CachedTokenAuthentication()
    drf = TokenAuthentication()

    def uncached():
        user, token = drf.authenticate_credentials(key)
        user.get_all_permissions()
        acts_for_others(user)
        return user, token

    for authentication in (signalled, stamped):
        authentication.authenticate_credentials(key)  # cached from now on
    assert signalled.authenticate_credentials(key) == stamped.authenticate_credentials(key) == uncached()
    return compare({"cached_before": lambda: signalled.authenticate_credentials(key),
                    "cached_after": lambda: stamped.authenticate_credentials(key),
                    "uncached": uncached}, args.rounds, args.calls * 4)


PARTS = {"list": part_list, "update": part_update, "cache": part_cache, "token": part_token}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("parts", nargs="+", choices=sorted(PARTS))
    parser.add_argument("--before", default=BEFORE)
    parser.add_argument("--queued", type=int, default=100_000, help="requests queued (list, update)")
    parser.add_argument("--claimed", type=int, default=750, help="requests claimed in one UPDATE (update)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    setup_django()
    from django.conf import settings
    from django.core.management import call_command

    settings.ALLOWED_HOSTS = ["*"]
    call_command("migrate", interactive=False, verbosity=0)
    results = {}
    for part in args.parts:
        results[part] = PARTS[part](args)
        print(f"{part}: " + ", ".join(f"{name} {ms} ms" for name, ms in results[part].items()), flush=True)
    print(json.dumps({"before": args.before, **results}))


if __name__ == "__main__":
    main()
