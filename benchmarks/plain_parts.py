"""Each hand-made part of issue 22 ("Hand-made parts replaced or made plain") against what
replaced it, both timed in one process, in alternating rounds (a shared machine drifts).

    .venv/bin/python -m carousel.infra.localservices -- .venv/bin/python benchmarks/plain_parts.py list
    (parts: list, update, cache, token; --before names the commit whose code is "before")

"before" is the module as it was at --before, read with `git show` and loaded beside the
current one; "after" is the working tree. Each part checks that both give the same answer
before it times them. Prints, per part, the median over --rounds rounds of the mean time of
one call; the last line is JSON."""
import argparse
import importlib.util
import json
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


def compare(named, rounds, calls):
    """{name: ms per call}: the median over `rounds` of each function's mean over `calls` calls,
    the functions taking turns within each round."""
    times = {name: [] for name in named}
    for _ in range(rounds):
        for name, fn in named.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - start) / calls * 1000)
    return {name: round(statistics.median(t), 3) for name, t in times.items()}


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


PARTS = {"list": part_list}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("parts", nargs="+", choices=sorted(PARTS))
    parser.add_argument("--before", default=BEFORE)
    parser.add_argument("--queued", type=int, default=100_000, help="requests queued (list)")
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
