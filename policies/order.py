"""The order in which to read one tape's requested files, under the tape model's locate costs.

Offset order reads the tape one wrap at a time, so scattered files cost about a tape pass per
requested wrap; sweeps over groups of wraps (forward along the even wraps, back along the odd
ones) travel less but change wrap at nearly every file. Which wins depends on how dense the
requests are, so read_order builds both kinds, keeps the cheapest, and improves it by moving
short chains of runs next to runs they lie near (Or-opt with neighbour lists). A handful of runs
is ordered exactly instead. Files that stream one into the next move as one run.
"""
from bisect import bisect_left
from collections import deque
from dataclasses import replace
from functools import lru_cache
from typing import NamedTuple

from carousel.tape import MEDIA, Media, Position, locate_between_s, places, position, rewind_from_s, rewind_s

# Where a byte lands is known only roughly: a cartridge's wraps hold a little more or less than
# the table says (compression, the drive that wrote it), and the error adds up along the tape,
# so deep in a tape the wrap of a file, and so the direction it is read in, is a guess. Costs
# are the mean over wraps holding this much more or less (SCENARIOS evenly spread): where the
# wrap is sure they are the model's, where it is not they favour orders that are good whichever
# wrap it is. 0 trusts the table exactly.
WRAP_UNCERTAINTY = 0.01
SCENARIOS = 5
EXACT_UP_TO = 7  # runs; the exact search takes under a millisecond at 7, growing as n² 2ⁿ
SWEEP_GROUPS = (1, 2, 4, 8, 16, 32)
# Runs times starting orders improved: every start for a few hundred runs, one for 1000.
IMPROVE_BUDGET = 1500
# Neighbours looked at on each side along the tape: enough to find the good moves, few enough
# to order 1000 files in a few tens of milliseconds.
NEAR_SAME_DIRECTION = 4
NEAR_OTHER_DIRECTION = 1
LONGEST_CHAIN = 3
MOVES_PER_RUN = 20  # a safety cap; the search normally stops well before


class Run(NamedTuple):
    start: Position
    end: Position  # the byte after the run: where the head is once it has read the run
    keys: list


def _by_offset(files):
    """The (key, offset, size) files in ascending offset, a size of None counted as 0."""
    return sorted(((key, offset, size or 0) for key, offset, size in files), key=lambda file: (file[1], file[2]))


def position_order(files):
    """Keys of the (key, offset, size) files of one tape in ascending offset: the order a tape
    system that schedules its own recalls reads a request in (dCache's and CTA's recalls,
    HPSS's ordered recall, the hsm-fifo model), whatever order they were sent in."""
    return [key for key, _, _ in _by_offset(files)]


def read_order(media, files):
    """Keys of the (key, offset, size) files of one tape, in the order to read them. Unknown
    media, "" or None: ascending offset (position_order). A size of None (not known yet)
    counts as 0."""
    by_offset = _by_offset(files)
    media = MEDIA.get(media) if isinstance(media, str) else media
    if not isinstance(media, Media) or len(by_offset) < 2:
        return [key for key, _, _ in by_offset]
    runs = streaming_runs(media, by_offset)
    cost = run_costs(media, runs)
    if len(runs) <= EXACT_UP_TO:
        order = exact_order(cost, len(runs))
    else:
        order = heuristic_order(media, runs, cost)
    return [key for index in order for key in runs[index].keys]


def streaming_runs(media, files_by_offset):
    """Group files that are read straight on one into the next, which costs no locate; a run
    is read whole. (Splitting one pays off now and then, when its files are large and its ends
    lie far apart along the tape, but rarely and by little.)"""
    bounds = []
    for key, offset, size in files_by_offset:
        if bounds and bounds[-1][1] == offset:
            bounds[-1][1] = offset + size
            bounds[-1][2].append(key)
        else:
            bounds.append([offset, offset + size, [key]])
    return [Run(position(media, start), position(media, end), keys) for start, end, keys in bounds]


def sweep(media, runs, groups):
    """Split the wraps into `groups` groups of neighbouring wraps; in each, read forward along
    its even wraps, then back along its odd ones."""
    def place(index):
        start = runs[index].start
        backward = start.wrap % 2
        return (start.wrap * groups // media.wraps, backward,
                -start.metres if backward else start.metres, index)
    return sorted(range(len(runs)), key=place)


def heuristic_order(media, runs, cost):
    """Offset order and a few sweeps, cheapest first, each improved by Or-opt while the budget
    lasts: different starts end in different local optima, so the best of them is kept."""
    def positioning(order):
        return positioning_s(cost, len(runs), order)

    # A dict as an ordered set: sweeps over many groups can equal offset order.
    candidates = {tuple(range(len(runs))): None}
    for groups in SWEEP_GROUPS:
        if groups < media.wraps // 2:
            candidates.setdefault(tuple(sweep(media, runs, groups)))
    starts = sorted(candidates, key=positioning)[:max(1, IMPROVE_BUDGET // len(runs))]
    neighbours = _neighbour_lists(cost, runs)
    return min((improve(cost, neighbours, list(order)) for order in starts), key=positioning)


def exact_order(cost, count):
    """The cheapest order of `count` runs, by dynamic programming over the sets of runs read
    (Held-Karp): count**2 * 2**count steps, for a handful of runs."""
    bot = count
    # (set read as a bit mask, last run read) -> (cheapest time, run read before the last)
    best = {(1 << run, run): (cost(bot, run), None) for run in range(count)}
    for read in range(1, 1 << count):
        for last in range(count):
            if (read, last) not in best:
                continue
            so_far = best[read, last][0]
            for following in range(count):
                if read & (1 << following):
                    continue
                state = (read | 1 << following, following)
                total = so_far + cost(last, following)
                if state not in best or total < best[state][0]:
                    best[state] = (total, last)
    read = (1 << count) - 1
    last = min(range(count), key=lambda run: best[read, run][0] + cost(run, bot))
    order = []
    while last is not None:
        order.append(last)
        read, last = read & ~(1 << last), best[read, last][1]
    return order[::-1]


def scenarios(media, uncertainty=None):
    """The tape models the costs average over: bytes per wrap spread evenly over the
    uncertainty (just the nominal model when it is 0)."""
    return _scenarios(media, WRAP_UNCERTAINTY if uncertainty is None else uncertainty, SCENARIOS)


@lru_cache(maxsize=64)  # a few technologies; every read order asks
def _scenarios(media, uncertainty, count):
    if uncertainty <= 0 or count < 2:
        return (media,)
    steps = [-uncertainty + 2 * uncertainty * k / (count - 1) for k in range(count)]
    return tuple(replace(media, bytes_per_wrap=round(media.bytes_per_wrap * (1 + step))) for step in steps)


def run_costs(media, runs, uncertainty=None):
    """cost(i, j): head time from the end of run i to the start of run j, the mean over the
    scenarios. Index len(runs) stands for BOT: leaving it is the locate after the load, going
    to it the rewind."""
    bot = len(runs)
    models = scenarios(media, uncertainty)
    if len(models) == 1:
        ends = [run.end for run in runs] + [position(media, 0)]
        starts = [run.start for run in runs]
        rewinds = [rewind_s(media, run.end.offset) for run in runs] + [0.0]

        def cost(i, j):
            return rewinds[i] if j == bot else locate_between_s(media, ends[i], starts[j])
        return cost
    share = 1 / len(models)
    end_offsets = [run.end.offset for run in runs] + [0]
    start_offsets = [run.start.offset for run in runs]
    # Per run, its (wrap, band, metres) in every model: the search asks for some 10^5 costs a
    # cycle, and Position objects and a call per model were most of their price. The sum is
    # tape.locate_between_s's, term for term, so the costs (and orders) are the same.
    ends = list(zip(*(places(m, end_offsets) for m in models)))
    starts = list(zip(*(places(m, start_offsets) for m in models)))
    rewinds = [sum(rewind_from_s(media, metres) for _, _, metres in at) * share for at in ends[:-1]] + [0.0]
    fixed, speed = media.c_fixed_s, media.locate_speed_m_s
    c_wrap, c_band, c_direction, c_back = media.c_wrap_s, media.c_band_s, media.c_direction_s, media.c_back_s
    known, stride = {}, bot + 1  # (i, j) as one int: no tuple to build per look-up

    def cost(i, j):
        if j == bot:
            return rewinds[i]
        found = known.get(i * stride + j)
        if found is None:
            here, there = end_offsets[i], start_offsets[j]
            total = 0.0
            if here != there:
                for (wrap, band, metres), (to_wrap, to_band, to_metres) in zip(ends[i], starts[j]):
                    switch = 0.0
                    if wrap != to_wrap:
                        switch += c_wrap
                        if band != to_band:
                            switch += c_band
                        if wrap % 2 != to_wrap % 2:
                            switch += c_direction
                    elif there < here:
                        switch += c_back
                    total += fixed + switch + abs(to_metres - metres) / speed
            found = known[i * stride + j] = share * total
        return found
    return cost


def positioning_s(cost, bot, order):
    """Locates and the rewind of one mount; reads, load and unload are the same in any order."""
    stops = [bot, *order, bot]
    return sum(cost(a, b) for a, b in zip(stops, stops[1:]))


def _nearest(metres_sorted, ids_sorted, metres, each_side):
    middle = bisect_left(metres_sorted, metres)
    return ids_sorted[max(0, middle - each_side):middle + each_side]


def _neighbour_lists(cost, runs):
    """For each run, the runs after which it might best be read (predecessors), and those it
    might best be followed by (successors), cheapest first, with their costs."""
    bot = len(runs)

    def by_direction(points):
        lookup = {}
        for direction in (0, 1):
            chosen = sorted((p.metres, i) for i, p in enumerate(points) if p.wrap % 2 == direction)
            lookup[direction] = ([m for m, _ in chosen], [i for _, i in chosen])
        return lookup

    ends = by_direction([run.end for run in runs])
    starts = by_direction([run.start for run in runs])

    def near(lookup, point, index):
        same, other = lookup[point.wrap % 2], lookup[1 - point.wrap % 2]
        # Offset neighbours may lie far along the tape yet be cheap to reach across a wrap turn.
        found = {index - 1, index + 1, bot}
        found.update(_nearest(*same, point.metres, NEAR_SAME_DIRECTION))
        found.update(_nearest(*other, point.metres, NEAR_OTHER_DIRECTION))
        found.discard(index)
        found.discard(-1)
        return found

    predecessors, successors = [], []
    for index, run in enumerate(runs):
        found = near(ends, run.start, index)
        predecessors.append(sorted((cost(u, index), u) for u in found))
        found = near(starts, run.end, index)
        successors.append(sorted((cost(index, w), w) for w in found))
    return predecessors, successors


def improve(cost, neighbours, order):
    """Or-opt: move chains of up to LONGEST_CHAIN consecutive runs to between two others while
    that shortens the mount; only insertion points next to neighbouring runs are tried."""
    bot = len(order)
    predecessors, successors = neighbours
    following = [0] * (bot + 1)
    preceding = [0] * (bot + 1)
    stops = [bot, *order, bot]
    for a, b in zip(stops, stops[1:]):
        following[a], preceding[b] = b, a

    pending = deque(order)
    queued = set(order)
    moves_left = MOVES_PER_RUN * len(order)
    while pending and moves_left:
        first = pending.popleft()
        queued.discard(first)
        move = _best_move(cost, first, following, preceding, predecessors, successors, bot)
        if move is None:
            continue
        first, last, before, after = move
        was_before, was_after = preceding[first], following[last]
        following[was_before], preceding[was_after] = was_after, was_before
        following[before], preceding[first] = first, before
        following[last], preceding[after] = after, last
        moves_left -= 1
        for touched in (was_before, was_after, before, after, first, last):
            if touched != bot and touched not in queued:
                pending.append(touched)
                queued.add(touched)

    result, index = [], following[bot]
    while index != bot:
        result.append(index)
        index = following[index]
    return result


def _best_move(cost, first, following, preceding, predecessors, successors, bot):
    """The best improving (first, last, before, after) for chains starting at `first`, or None."""
    chain = [first]
    last = first
    for length in range(1, LONGEST_CHAIN + 1):
        if length > 1:
            last = following[last]
            if last == bot:
                return None
            chain.append(last)
        was_before, was_after = preceding[first], following[last]
        removal_gain = (cost(was_before, first) + cost(last, was_after)
                        - cost(was_before, was_after))
        # Not zero: a rounding-error gain must not move runs back and forth.
        best_gain, best = 1e-9, None
        # Lists are cheapest first: once the new edge alone costs the whole gain, stop.
        for new_cost, before in predecessors[first]:
            if new_cost >= removal_gain:
                break
            if before == was_before or before in chain:
                continue
            after = following[before]
            gain = removal_gain - new_cost - cost(last, after) + cost(before, after)
            if gain > best_gain:
                best_gain, best = gain, (first, last, before, after)
        for new_cost, after in successors[last]:
            if new_cost >= removal_gain:
                break
            if after == was_after or after in chain:
                continue
            before = preceding[after]
            gain = removal_gain - new_cost - cost(before, first) + cost(before, after)
            if gain > best_gain:
                best_gain, best = gain, (first, last, before, after)
        if best:
            return best
    return None
