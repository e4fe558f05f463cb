import itertools
import random

import pytest

from carousel.tape import GB, MEDIA, read_s, tape_work_s
from policies import order
from policies.order import (
    EXACT_UP_TO, exact_order, heuristic_order, positioning_s, read_order, run_costs, scenarios,
    streaming_runs,
)

LTO7 = MEDIA["LTO-7"]


def scattered_files(rng, media, count, mean_size=2 * GB, streaming=0.2):
    """(key, offset, size) files at random places on the tape, shuffled; a share of them is
    written right before the next one, so that the two stream."""
    starts = sorted(rng.sample(range(media.capacity_bytes), count))
    ends = starts[1:] + [media.capacity_bytes]
    files = []
    for key, (start, limit) in enumerate(zip(starts, ends)):
        size = limit - start if rng.random() < streaming else int(rng.expovariate(1 / mean_size))
        files.append((key, start, max(1, min(size, limit - start))))
    rng.shuffle(files)
    return files


def work_s(media, files, keys):
    placed = {key: (offset, size) for key, offset, size in files}
    return tape_work_s(media, [placed[key] for key in keys])


def logical_keys(files):
    return [key for key, _, _ in sorted(files, key=lambda file: file[1])]


def test_unknown_media_falls_back_to_offset_order():
    files = [("c", 30 * GB, GB), ("a", 10 * GB, GB), ("b", 20 * GB, GB)]
    assert read_order(None, files) == ["a", "b", "c"]
    assert read_order("LTO-99", files) == ["a", "b", "c"]
    assert read_order("", files) == ["a", "b", "c"]
    assert read_order("LTO-7", []) == []


def test_an_unknown_size_counts_as_zero():
    files = [("c", 30 * GB, None), ("a", 10 * GB, GB), ("b", 20 * GB, None)]
    assert sorted(read_order("LTO-7", files)) == ["a", "b", "c"]
    assert read_order(None, files) == ["a", "b", "c"]


def test_it_saves_a_tape_pass_that_offset_order_makes():
    # Wrap 2 runs forward again from BOT: in offset order the head goes out to the end of the
    # tape for wrap 0, back to BOT for wrap 2, and out again for wrap 4.
    bytes_per_wrap, size = LTO7.bytes_per_wrap, GB // 10
    files = [
        ("far on wrap 0", int(0.9 * bytes_per_wrap), size),
        ("near BOT on wrap 2", int(2.1 * bytes_per_wrap), size),
        ("far on wrap 4", int(4.9 * bytes_per_wrap), size),
    ]
    order = read_order("LTO-7", files)
    assert order == ["far on wrap 0", "far on wrap 4", "near BOT on wrap 2"]
    saved = work_s(LTO7, files, logical_keys(files)) - work_s(LTO7, files, order)
    assert saved > 0.9 * 1.6 * LTO7.length_m / LTO7.locate_speed_m_s


@pytest.mark.parametrize("name", [None, "9940B", "LTO-4", "LTO-7", "LTO-9"])
def test_it_returns_every_key_once(name):
    rng = random.Random(1)
    files = scattered_files(rng, MEDIA[name or "LTO-7"], 400)
    assert sorted(read_order(name, files)) == list(range(400))


def test_streaming_runs_stay_together_in_offset_order():
    rng = random.Random(2)
    files = scattered_files(rng, LTO7, 300, streaming=0.5)
    runs = streaming_runs(LTO7, sorted(files, key=lambda file: file[1]))
    assert any(len(run.keys) > 2 for run in runs)
    order = read_order("LTO-7", files)
    for run in runs:
        first = order.index(run.keys[0])
        assert order[first:first + len(run.keys)] == run.keys


def test_it_is_deterministic():
    rng = random.Random(3)
    files = scattered_files(rng, LTO7, 500)
    order = read_order("LTO-7", files)
    assert read_order("LTO-7", list(reversed(files))) == order
    assert read_order("LTO-7", sorted(files)) == order


def expected_work_s(media, files, keys):
    """The mean mount time over the tape models the order allows for (policies.order.scenarios)."""
    models = scenarios(MEDIA[media])
    return sum(work_s(m, files, keys) for m in models) / len(models)


# (wrap uncertainty, most files, cases per technology): the mean over uncertain wraps costs
# SCENARIOS times as much to brute-force, so it gets smaller cases.
@pytest.mark.parametrize("uncertainty,most,cases", [(0.0, 7, 6), (order.WRAP_UNCERTAINTY, 6, 6)])
def test_tiny_cases_are_within_5_percent_of_brute_force(uncertainty, most, cases, monkeypatch):
    """Against every order, for the cost the order minimises: the model's when positions are
    trusted exactly, its mean over the uncertain wraps otherwise."""
    monkeypatch.setattr(order, "WRAP_UNCERTAINTY", uncertainty)
    per_media, optimal, cases = cases, 0, 0
    worst = 0.0
    for name in ("9940B", "LTO-4", "LTO-6", "LTO-7", "LTO-9"):
        rng = random.Random(name)
        for _ in range(per_media):
            files = scattered_files(rng, MEDIA[name], rng.randint(2, most), mean_size=GB)
            ours = expected_work_s(name, files, read_order(name, files))
            # Every order of the files, even those that split a streaming run.
            every_order = itertools.permutations(range(len(files)))
            best = min(expected_work_s(name, files, keys) for keys in every_order)
            assert ours <= best * 1.05
            cases += 1
            optimal += ours <= best * (1 + 1e-9)
            worst = max(worst, ours / best - 1)
    print(f"\nbrute force, 2-7 files: optimal in {optimal}/{cases}, worst {worst:.2%} above")


def test_the_heuristic_is_close_to_exact_just_above_the_exact_range():
    excess = []
    for name in ("9940B", "LTO-4", "LTO-7", "LTO-9"):
        rng = random.Random(name)
        for _ in range(10):
            media = MEDIA[name]
            files = scattered_files(rng, media, rng.randint(EXACT_UP_TO + 1, 11), mean_size=GB)
            runs = streaming_runs(media, sorted(files, key=lambda file: file[1]))
            cost = run_costs(media, runs)
            fixed = media.load_s + media.unload_s + sum(read_s(media, size) for _, _, size in files)
            heuristic = fixed + positioning_s(cost, len(runs), heuristic_order(media, runs, cost))
            exact = fixed + positioning_s(cost, len(runs), exact_order(cost, len(runs)))
            excess.append(heuristic / exact - 1)
    optimal = sum(e < 1e-9 for e in excess)
    print(f"\nheuristic vs exact, 8-11 runs: optimal in {optimal}/{len(excess)}, "
          f"mean {sum(excess) / len(excess):.2%} above, worst {max(excess):.2%}")
    assert sum(excess) / len(excess) < 0.01
    assert max(excess) < 0.05


def test_allowing_for_uncertain_wraps_pays_on_tapes_whose_wraps_differ(monkeypatch):
    """Tapes whose wraps hold up to 2% more or less than the table (a departed library, as
    `simulate --mismatch 0.3` draws them): the order that allows for it reads them faster on
    the whole than the one that trusts the table exactly, and gives up little on exact tapes."""
    from dataclasses import replace

    robust, exact, robust_nominal, exact_nominal = [], [], [], []
    for trial in range(12):
        rng = random.Random(trial)
        files = scattered_files(rng, MEDIA["LTO-8"], rng.randint(60, 200), mean_size=2 * GB)
        real = replace(MEDIA["LTO-8"], bytes_per_wrap=round(MEDIA["LTO-8"].bytes_per_wrap * rng.uniform(0.98, 1.02)))
        careful = read_order("LTO-8", files)
        monkeypatch.setattr(order, "WRAP_UNCERTAINTY", 0.0)
        trusting = read_order("LTO-8", files)
        monkeypatch.undo()
        robust.append(work_s(real, files, careful))
        exact.append(work_s(real, files, trusting))
        robust_nominal.append(work_s("LTO-8", files, careful))
        exact_nominal.append(work_s("LTO-8", files, trusting))
    print(f"\ndeparted tapes: allowing for it {sum(robust):,.0f} s, trusting the table {sum(exact):,.0f} s; "
          f"exact tapes: {sum(robust_nominal):,.0f} s against {sum(exact_nominal):,.0f} s")
    assert sum(robust) < 0.95 * sum(exact)
    assert sum(robust_nominal) < 1.1 * sum(exact_nominal)


def test_it_beats_logical_order_on_scattered_files():
    gains = []
    for trial in range(40):
        rng = random.Random(trial)
        name = rng.choice(sorted(MEDIA))
        mean_size = rng.choice([0.2 * GB, 2 * GB])
        files = scattered_files(rng, MEDIA[name], rng.randint(8, 300), mean_size=mean_size)
        logical = work_s(name, files, logical_keys(files))
        gains.append(1 - work_s(name, files, read_order(name, files)) / logical)
    at_least_as_good = sum(gain >= 0 for gain in gains)
    average = sum(gains) / len(gains)
    print(f"\nvs logical order: at least as good in {at_least_as_good}/{len(gains)}, "
          f"average gain {average:.1%} of the mount time, best {max(gains):.1%}")
    assert at_least_as_good >= 0.9 * len(gains)
    assert average > 0.15


@pytest.mark.parametrize("name", ["LTO-7", "LTO-8"])
def test_the_costs_are_each_models_locate_averaged(name):
    # run_costs works on plain tuples for speed; what it returns must stay the mean of
    # tape.locate_between_s over the scenarios (and the mean rewind towards BOT), bit for bit.
    from carousel.tape import locate_between_s, position, rewind_s

    media = MEDIA[name]
    rng = random.Random(7)
    files = sorted(scattered_files(rng, media, 40), key=lambda file: file[1])
    runs = streaming_runs(media, files)
    models = scenarios(media, 0.01)
    assert len(models) > 1
    cost = run_costs(media, runs, 0.01)
    bot = len(runs)
    for i in range(bot + 1):
        for j in range(bot + 1):
            if j == bot:
                want = 0.0 if i == bot else sum(rewind_s(m, runs[i].end.offset) for m in models) * (1 / len(models))
            else:
                here = runs[i].end.offset if i < bot else 0
                want = sum(locate_between_s(m, position(m, here), position(m, runs[j].start.offset))
                           for m in models) * (1 / len(models))
            assert cost(i, j) == want, (i, j)
