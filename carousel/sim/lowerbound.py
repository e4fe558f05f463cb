"""The physical lower bound on a workload's makespan (tape-physics.md): no schedule in the
simulated library (carousel/sim/library.py) can read the last byte sooner. A pure function of the
workload and the constants of carousel/tape.py: no policy, replay or baseline goes into it.

The bound is the largest of:
- drive work: per technology, every tape's least drive time summed and shared by its drives;
  the last tape on each drive needs no rewind, unload or put-back before the last byte, so the
  largest of those savings, one per drive, come off;
- one tape: the largest single tape's least time (one cartridge is in one drive at a time, so
  a tape split over several mounts takes at least this much, one mount after another);
- robot: every tape with requests is fetched once; the robots share the fetches, and the last
  tape fetched still has to be loaded and a file read;
- bytes: per technology, the bytes over the drives' read rate (with the per-file overheads);
- arrival: the last request's arrival plus the least time to read its file.

A tape's least time counts what every schedule pays: the robot fetch and the load; every
file's read (size over rate plus the per-file overhead); the rewind's fixed cost, the unload
and the put-back; and the positioning, counted two ways of which the larger holds:
- sweeps: a locate's fixed cost for every run of requested files not reached by streaming;
  the wrap change into every requested wrap, the band change into every requested band, and
  one change of direction, unless the head gets there by reading on through a wrap turn; and
  the unavoidable head travel (travel_m);
- entries: every run's cheapest way in, from BOT or from the end of any file (entry_costs_s).
Each is checked against exact optima in tests/test_lowerbound.py.
"""
from bisect import bisect_left
from dataclasses import dataclass, field

from carousel.tape import MEDIA, band_of, position, read_s, wrap_of


@dataclass(frozen=True)
class TapeBound:
    label: str
    closed_s: float  # least drive time, fetch to put-back
    open_s: float  # least drive time, fetch to the end of the last read (the tape last on its drive)


@dataclass(frozen=True)
class Bound:
    seconds: float
    parts: dict = field(default_factory=dict)  # name -> seconds
    tapes: tuple = ()  # TapeBound, per tape with requests

    @property
    def binding(self):
        return max(self.parts, key=self.parts.get)


def lower_bound(workload):
    """The Bound of a carousel.sim.workload.Workload."""
    per_tape = workload.requested_files()
    rate = workload.read_rate_mb_s
    tapes = []
    by_media = {}
    for label, files in sorted(per_tape.items()):
        media = workload.tape_media[label]
        bound = tape_bound(label, media, [(f.offset, f.size) for f in files], read_rate_mb_s=rate,
                           exchange_s=workload.exchange_s)
        tapes.append(bound)
        by_media.setdefault(media, []).append((bound, files))
    parts = {"drive_work": 0.0, "one_tape": 0.0, "robot": 0.0, "bytes": 0.0, "arrival": 0.0}
    for media, entries in by_media.items():
        drives = workload.drives[media]
        savings = sorted((b.closed_s - b.open_s for b, _ in entries), reverse=True)
        work = sum(b.closed_s for b, _ in entries) - sum(savings[:drives])
        parts["drive_work"] = max(parts["drive_work"], work / drives)
        reads = sum(read_s(media, f.size, rate) for _, files in entries for f in files)
        parts["bytes"] = max(parts["bytes"], reads / drives)
    parts["one_tape"] = max(b.open_s for b in tapes)
    # The last fetch ends no sooner than the fetches shared by the robots; then a load and a read.
    fetches = -(-len(tapes) // workload.robots)
    parts["robot"] = fetches * workload.exchange_s + min(
        MEDIA[workload.tape_media[label]].load_s + min(read_s(workload.tape_media[label], f.size, rate) for f in files)
        for label, files in per_tape.items())
    start = workload.requests[0].t
    parts["arrival"] = max(r.t - start + read_s(workload.files[r.path].media, workload.files[r.path].size, rate)
                           for r in workload.requests)
    return Bound(seconds=max(parts.values()), parts=parts, tapes=tuple(tapes))


def tape_bound(label, media, files, *, read_rate_mb_s=None, exchange_s):
    """The least drive time of one tape's (offset, size) files, whatever their order and however
    many mounts they are read in."""
    media = MEDIA[media] if isinstance(media, str) else media
    runs = streaming_runs(files)
    mounted = exchange_s + media.load_s + sum(read_s(media, size, read_rate_mb_s) for _, size in files)
    tail = media.rewind_fixed_s + media.unload_s + exchange_s
    # Two ways to count the positioning, each valid alone: whole sweeps with the switches no
    # order avoids, or every run's cheapest way in.
    sweeps = media.c_fixed_s * sum(1 for start, _ in runs if start != 0) + switch_costs_s(media, runs)
    closed_m, open_m = travel_m(media, runs)
    # A mount may stop, or locate away, after any file: file ends, not only run ends.
    ends = [offset + size for offset, size in files]
    entries = entry_costs_s(media, runs, ends)
    home = min(position(media, end).metres for end in ends) / media.locate_speed_m_s
    return TapeBound(label=label,
                     closed_s=mounted + tail + max(sweeps + closed_m / media.locate_speed_m_s, entries + home),
                     open_s=mounted + max(sweeps + open_m / media.locate_speed_m_s, entries))


def streaming_runs(files):
    """[start, end) byte ranges of files read one straight into the next; each needs a locate
    unless it starts at BOT."""
    runs = []
    for offset, size in sorted(files):
        if runs and runs[-1][1] == offset:
            runs[-1][1] = offset + size
        else:
            runs.append([offset, offset + size])
    return runs


def switch_costs_s(media, runs):
    """The wrap, band and direction changes no order can avoid. The head starts on wrap 0 going
    forward. Reading on through the end of a wrap puts it on the next wrap for free (the head
    after a run lies at the run's end offset, on that offset's wrap)."""
    streamed = set()  # wraps the head reaches by reading on
    turns_forward_to_back = False
    for start, end in runs:
        first, last = wrap_of(media, start), wrap_of(media, end)
        streamed.update(range(first + 1, last + 1))
        if first % 2 == 0 and last > first:
            turns_forward_to_back = True
    start_wraps = {wrap_of(media, start) for start, _ in runs}
    wraps = {w for w in start_wraps if w != 0 and w not in streamed}
    streamed_bands = {band_of(media, w) for w in streamed}
    bands = {band_of(media, w) for w in start_wraps} - {0} - streamed_bands
    backward = any(w % 2 for w in start_wraps) and not turns_forward_to_back
    return len(wraps) * media.c_wrap_s + len(bands) * media.c_band_s + backward * media.c_direction_s


def entry_costs_s(media, runs, ends):
    """Every run is reached by one locate at least, from BOT or from where some file ends (a
    mount may read part of a run): the sum over runs of the cheapest such locate. Cheapest per
    class of starting point (the run's own wrap, then each band and direction), the switch
    costs of a class taken at their least (a wrap change for every other wrap, no step back),
    so each class's figure is at most the true cheapest locate from it."""
    ends = [position(media, 0)] + [position(media, end) for end in ends]
    by_wrap, by_group = {}, {}
    for p in ends:
        by_wrap.setdefault(p.wrap, []).append(p.metres)
        by_group.setdefault((p.band, p.wrap % 2), []).append(p.metres)
    for lists in (by_wrap, by_group):
        for metres in lists.values():
            metres.sort()
    speed = media.locate_speed_m_s
    total = 0.0
    for start, _ in runs:
        if start == 0:
            continue  # read straight after the load
        there = position(media, start)
        best = _nearest_m(by_wrap.get(there.wrap, []), there.metres) / speed
        for (band, parity), metres in by_group.items():
            switch = (media.c_wrap_s + (media.c_band_s if band != there.band else 0.0)
                      + (media.c_direction_s if parity != there.wrap % 2 else 0.0))
            if switch < best:
                best = min(best, switch + _nearest_m(metres, there.metres) / speed)
        total += media.c_fixed_s + best
    return total


def _nearest_m(sorted_metres, metres):
    if not sorted_metres:
        return float("inf")
    i = bisect_left(sorted_metres, metres)
    return min(abs(sorted_metres[j] - metres) for j in (i - 1, i) if 0 <= j < len(sorted_metres))


def _metres(media, wrap, byte):
    fraction = min(max((byte - wrap * media.bytes_per_wrap) / media.bytes_per_wrap, 0.0), 1.0)
    return media.length_m * (fraction if wrap % 2 == 0 else 1.0 - fraction)


def pieces(media, start, end):
    """(wrap, metres where reading starts, metres where it ends) of a byte range, one per wrap."""
    out = []
    first, last = wrap_of(media, start), wrap_of(media, max(start, end - 1))
    for wrap in range(first, last + 1):
        low = max(start, wrap * media.bytes_per_wrap)
        high = end if wrap == media.wraps - 1 else min(end, (wrap + 1) * media.bytes_per_wrap)
        out.append((wrap, _metres(media, wrap, low), _metres(media, wrap, high)))
    return out


def travel_m(media, runs):
    """The least distance the head moves without reading, over all orders and mounts: (for
    mounts that end with a rewind to BOT, when the last one ends where its last read ends).

    At every point x along the tape, reading crosses it once per requested piece covering it:
    F(x) forward (even wraps), B(x) backward (odd wraps). A walk from BOT back to BOT crosses x
    as often forward as backward, so at least 2 max(F, B) times, and at least twice if anything
    lies beyond x: the crossings above F + B are travel. A walk that ends at e crosses each
    x < e once more forward than backward: at least 2 max(F, B + 1) - 1 times. Summed over
    the pieces between breakpoints, for the best e."""
    forward, backward = [], []
    reach = 0.0
    for start, end in runs:
        for wrap, begin, finish in pieces(media, start, end):
            reach = max(reach, begin, finish)
            if finish != begin:
                (forward if wrap % 2 == 0 else backward).append((min(begin, finish), max(begin, finish)))
    points = sorted({0.0, reach, *(x for span in forward + backward for x in span)})
    delta_f, delta_b = {}, {}
    for spans, delta in ((forward, delta_f), (backward, delta_b)):
        for low, high in spans:
            delta[low] = delta.get(low, 0) + 1
            delta[high] = delta.get(high, 0) - 1
    closed = 0.0
    saving = best_saving = 0.0  # how much ending the walk at a point saves (<= 0 is a saving)
    f = b = 0
    for left, right in zip(points, points[1:]):
        f += delta_f.get(left, 0)
        b += delta_b.get(left, 0)
        length = right - left
        beyond = 1 if left < reach else 0
        crossings_closed = 2 * max(f, b, beyond)
        crossings_open = 2 * max(f, b + 1) - 1
        closed += length * (crossings_closed - f - b)
        saving += length * (crossings_open - crossings_closed)
        best_saving = min(best_saving, saving)
    return closed, closed + best_saving
