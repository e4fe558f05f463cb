"""choose() reads a policy's rank only as far as the allotment goes (SortPolicy.tape_order and
ranked): the same requests, in the same order, as ranking them all (the overdue ones first,
the tape of the oldest first), sorting by priority (stably) and taking the allotment, which is
what it did before. Pure: no database."""
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.sorting import (
    Candidate, Fifo, Params, Slider, SortPolicy, TapeId, TapeInfo, _without_cut_tape, worth_mounting,
)


def reference_choose(policy, candidates, tapes, allotment, params):
    """choose() as it was: the whole rank, sorted by priority, cut at the allotment."""
    if allotment <= 0:
        return []
    overdue = policy.rank([c for c in candidates if c.age_s >= params.max_wait_s], tapes, params)
    first, oldest = {}, {}
    for i, c in enumerate(overdue):
        first.setdefault(c.tape, i)
        oldest[c.tape] = max(oldest.get(c.tape, 0.0), c.age_s)
    chosen = sorted(overdue, key=lambda c: (-oldest[c.tape], first[c.tape]))[:allotment]
    if len(chosen) < allotment:
        taken = {c.id for c in chosen}
        rest = [c for c in candidates if c.id not in taken and worth_mounting(tapes[c.tape], params)]
        ranked = policy.rank(rest, tapes, params)
        ranked.sort(key=lambda c: -c.priority)
        chosen += ranked[:allotment - len(chosen)]
    if policy.whole_tapes and chosen:
        chosen = _without_cut_tape(chosen, tapes)
    return chosen


files = st.lists(st.tuples(st.integers(0, 7), st.integers(0, 12 * 10**12), st.integers(1, 5 * 10**9),
                           st.sampled_from([0, 0, 0, 1, 2]),
                           # ages that tie (a submission shares its time of entry), some overdue
                           st.sampled_from([0.0, 100.0, 160_000.0, 170_000.0]) | st.floats(0, 200_000)),
                 min_size=0, max_size=60)


@settings(max_examples=150, deadline=None)
@given(files=files, allotment=st.integers(0, 70), policy=st.sampled_from([Fifo, TapeId, Slider]))
def test_choose_reads_the_rank_lazily_and_gives_what_the_whole_rank_gives(files, allotment, policy):
    candidates = [Candidate(id=i, user=1, tape=t, position=p, size=s, priority=pr, age_s=age)
                  for i, (t, p, s, pr, age) in enumerate(files)]
    def tapes():  # fresh, so that no read order is remembered from the other call
        return {t: TapeInfo(id=t, media="LTO-8", files=sum(1 for c in candidates if c.tape == t) + t, bytes=0,
                            oldest_age_s=0.0, user_files={1: sum(1 for c in candidates if c.tape == t)})
                for t in range(8)}
    params = Params(max_wait_s=150_000)
    assert policy().choose(candidates, tapes(), allotment, params) == reference_choose(
        policy(), candidates, tapes(), allotment, params)


def test_a_site_policy_with_rank_only_still_works():
    class Backwards(SortPolicy):
        name = "BACKWARDS"

        def rank(self, candidates, tapes, params):
            return sorted(candidates, key=lambda c: -c.id)

    candidates = [Candidate(id=i, user=1, tape=0, position=i, size=1, priority=0, age_s=0.0) for i in range(5)]
    tapes = {0: TapeInfo(id=0, media="LTO-8", files=5, bytes=5, oldest_age_s=0.0, user_files={1: 5})}
    assert [c.id for c in Backwards().choose(candidates, tapes, 3, Params(max_wait_s=1e9))] == [4, 3, 2]


def test_a_few_urgent_files_put_only_their_tapes_in_read_order(monkeypatch):
    # One priority-1 file among 40 tapes of a user's pool, an allotment of that one file: only
    # its tape is ordered (the pass for priority 1 skips tapes without such files).
    import policies.sorting as sorting

    ordered = []
    real = sorting.read_order

    def counting(media, files):
        ordered.append(tuple(sorted(k for k, _, _ in files)))
        return real(media, files)

    monkeypatch.setattr(sorting, "read_order", counting)
    candidates = [Candidate(id=t * 10 + i, user=1, tape=t, position=i * 10**11, size=10**9,
                            priority=1 if (t, i) == (7, 2) else 0, age_s=0.0) for t in range(40) for i in range(3)]
    tapes = {t: TapeInfo(id=t, media="LTO-8", files=3, bytes=3 * 10**9, oldest_age_s=0.0, user_files={1: 3})
             for t in range(40)}
    chosen = TapeId().choose(candidates, tapes, 1, Params(max_wait_s=1e9, mount_min_files=1))
    assert [c.id for c in chosen] == [72]
    assert ordered == [(70, 71, 72)]
