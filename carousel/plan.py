"""The mount plan: which drive reads which tape's work, in what order, and where a tape's work
is cut into pieces read one after another on different drives. Pure: plain data in and out;
the loop (carousel/mounts.py, carousel/claiming.py) turns pieces into jobs chained one after another per drive.

One chain per drive: the work it will do, one piece (one mount) after another. A chain's
next piece is sent to the stager when its previous one is done, so the stager holds about a
mount per drive and the broker keeps the rest of the queue, where the policies can still
reorder it and short mounts can go first.

Two ways to lay out new work on the chains, given how long each chain's committed work still
takes (`ends`):
- whole tapes, longest first, each to the chain that frees first (LPT list scheduling): one
  mount per tape; used while more work waits behind the window.
- when the planned work is the last there is (`split=True`), McNaughton's wrap-around rule,
  which is optimal for preemptive scheduling and here has a set-up cost per piece: bisect for the
  smallest makespan T at which the tapes, longest first, fill the chains up to T; a tape that
  overflows a chain is cut, its head closing that chain and its tail opening the next one. The
  tail is read first (on the next chain, as soon as that chain is free), the head last; the two
  never overlap, which is checked, so one cartridge is never wanted by two drives at once. The
  cut is kept only when it beats whole tapes. 21 tapes on 15 drives take two rounds whole;
  cut, the drives finish together.
"""
import heapq
from bisect import bisect_right
from dataclasses import dataclass

# No piece shorter than this: a mount's fixed costs (robot, load, rewind, unload) are a few
# minutes, so a shorter piece costs more drive time than it saves.
MIN_PIECE_S = 300.0
BISECT_STEPS = 40


@dataclass(frozen=True)
class TapeWork:
    """One tape's new work: its files' keys in read order, and the drive time of the mounts
    reading a prefix or a suffix of them (carousel.tape.mount_profile)."""

    tape: object
    keys: tuple
    pre: tuple
    suf: tuple

    @property
    def seconds(self):
        return self.pre[-1]


@dataclass(frozen=True)
class Piece:
    tape: object
    keys: tuple
    seconds: float  # estimated drive time of its mount
    start_s: float  # planned start, seconds from now


def plan(ends, tapes, *, split):
    """Lay `tapes` (TapeWork) out on the chains. `ends`: {chain: seconds until its committed
    work is done}. Returns ({chain: [Piece, ...] to append, in order}, planned makespan)."""
    tapes = sorted((t for t in tapes if t.keys), key=lambda t: (-t.seconds, str(t.tape)))
    if not tapes or not ends:
        return {}, max(ends.values(), default=0.0)
    whole, whole_span = _longest_first(ends, tapes)
    if not split or len(ends) < 2:
        return whole, whole_span
    best = None
    low = (sum(ends.values()) + sum(t.seconds for t in tapes)) / len(ends)
    high = whole_span
    for _ in range(BISECT_STEPS):
        middle = (low + high) / 2
        trial = _fill(ends, tapes, middle)
        if trial is None:
            low = middle
        else:
            high, best = middle, trial
        if high - low < 1.0:
            break
    if best is None:
        return whole, whole_span
    span = max(p.start_s + p.seconds for pieces in best.values() for p in pieces)
    span = max(span, max(ends.values()))
    return (best, span) if span < whole_span else (whole, whole_span)


def _longest_first(ends, tapes):
    heap = [(end, str(chain), chain) for chain, end in ends.items()]
    heapq.heapify(heap)
    out = {}
    for tape in tapes:
        end, name, chain = heapq.heappop(heap)
        out.setdefault(chain, []).append(Piece(tape.tape, tape.keys, tape.seconds, end))
        heapq.heappush(heap, (end + tape.seconds, name, chain))
    return out, max(end for end, _, _ in heap)


def _fill(ends, tapes, limit):
    """McNaughton's fill up to `limit`, or None when the tapes do not fit."""
    chains = sorted(ends, key=lambda c: (ends[c], str(c)))
    out = {c: [] for c in chains}
    c = 0
    used = ends[chains[0]]
    if used > limit:
        return None
    for tape in tapes:
        n = len(tape.keys)
        if used + tape.seconds <= limit:
            out[chains[c]].append(Piece(tape.tape, tape.keys, tape.seconds, used))
            used += tape.seconds
            continue
        if c + 1 >= len(chains):
            return None
        nxt = ends[chains[c + 1]]
        # The longest head that fits in what is left of this chain; both pieces worth a mount,
        # and the tail (read first, on the next chain) done before the head starts.
        k = min(bisect_right(tape.pre, limit - used) - 1, n - 1)
        while k > 0 and (tape.suf[k] < MIN_PIECE_S or nxt + tape.suf[k] > used):
            k -= 1
        if k > 0 and tape.pre[k] < MIN_PIECE_S:
            k = 0
        if k:
            out[chains[c]].append(Piece(tape.tape, tape.keys[:k], tape.pre[k], used))
        c += 1
        used = nxt
        out[chains[c]].append(Piece(tape.tape, tape.keys[k:], tape.suf[k], used))
        used += tape.suf[k]
        if used > limit:
            return None
    return {chain: pieces for chain, pieces in out.items() if pieces}
