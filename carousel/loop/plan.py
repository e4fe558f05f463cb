"""The mount plan: which drive reads which tape's work, in what order, and where a tape's work
is cut into pieces read one after another on different drives. Pure: plain data in and out;
the loop (carousel/loop/mounts.py, carousel/loop/claiming.py) turns pieces into jobs chained one after another per drive.

One chain per drive: the work it will do, one piece (one mount) after another. A chain's
next piece is sent to the stager when its previous one is done, so the stager holds about a
mount per drive and the broker keeps the rest of the queue, where the policies can still
reorder it and short mounts can go first.

Two ways to lay out new work on the chains, given how long each chain's committed work still
takes (`ends`):
- while more work waits behind the window: whole tapes in the order they come (the order the
  policies chose them: the sharing policy's turns of drive time, policies/selection.py), each
  to the chain that frees first. One mount per tape, and the drives read the tapes in the
  order of the turns, so each user's share of the drives' time holds while they all have work.
  (Longest first would serve whoever has the longest tapes first, whatever their share.)
- when the planned work is the last there is (`split=True`), the same, and then the final
  round (the tapes that start within one mount of the moment the first drive would go idle,
  where the drives would otherwise finish apart; the turns before it stay as they are) is laid out again for the shortest makespan: whole tapes
  longest first (LPT list scheduling), or McNaughton's wrap-around rule,
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
    group: object = None  # whose drive time it is (drive allocation)

    @property
    def seconds(self):
        return self.pre[-1]


@dataclass(frozen=True)
class Allocation:
    """Drive allocation per group, as ERADAT and TReqS have it: `limits` {group: (reserved,
    most or None)}; `busy` {chain: [(start s, end s, group)]}: the committed work on the
    chains, so what runs at a moment counts. When a chain frees, a group with work below its
    reserved drives takes it first (the first of its tapes in turn); otherwise the first tape
    in turn whose group is below its most. A group borrows drives nobody else needs and gives
    them back at its next mount boundary. A chain none of whose waiting tapes may go waits
    for the next mount to end."""

    limits: dict
    busy: dict

    def running(self, out, chain, at):
        """{group: chains other than `chain` reading its work at `at`}."""
        count = {}
        for other, segments in self.busy.items():
            if other != chain:
                for start, end, group in segments:
                    if start <= at < end:
                        count[group] = count.get(group, 0) + 1
        for other, pieces in out.items():
            if other != chain:
                for piece in pieces:
                    if piece.start_s <= at < piece.start_s + piece.seconds:
                        count[piece.group] = count.get(piece.group, 0) + 1
        return count

    def pick(self, tapes, running):
        """The index in `tapes` (in turn) of the one to mount next, or None."""
        first = None
        for i, tape in enumerate(tapes):
            reserved, most = self.limits.get(tape.group, (0, None))
            now = running.get(tape.group, 0)
            if most is not None and now >= most:
                continue
            if now < reserved:
                return i
            if first is None:
                first = i
        return first

    def next_end(self, out, chain, at):
        ends = [end for other, segments in self.busy.items() if other != chain for _, end, _ in segments if end > at]
        ends += [p.start_s + p.seconds for other, pieces in out.items() if other != chain for p in pieces
                 if p.start_s + p.seconds > at]
        return min(ends, default=None)


@dataclass(frozen=True)
class Piece:
    tape: object
    keys: tuple
    seconds: float  # estimated drive time of its mount
    start_s: float  # planned start, seconds from now
    group: object = None


def plan(ends, tapes, *, split, allocation=None):
    """Lay `tapes` (TapeWork) out on the chains. `ends`: {chain: seconds until its committed
    work is done}. Returns ({chain: [Piece, ...] to append, in order}, planned makespan).

    Whole tapes in the order given, each to the chain that frees first. With `split` (the
    last of the backlog), the final round (the tapes that start within one mount of the moment
    the first drive would go idle, where the drives would otherwise finish apart) is laid out again for the
    shortest makespan: whole longest first, or cut (McNaughton), whichever ends first; the
    tapes before it keep their turns."""
    given = [t for t in tapes if t.keys]
    if not given or not ends:
        return {}, max(ends.values(), default=0.0)
    in_turn, in_turn_span = _list_schedule(ends, given, allocation)
    if not split or len(ends) < 2 or (allocation and allocation.limits):
        # (Drive allocation keeps its turns to the end: a cut would read one group's tape on
        # two drives at once, past what its most allows.)
        return in_turn, in_turn_span
    # The final round: the pieces that start within one mount (the longest) of the moment the
    # first drive would go idle; a drive could have taken any of them instead.
    idle = min(max([ends[chain], *(p.start_s + p.seconds for p in in_turn.get(chain, ()))]) for chain in ends)
    since = idle - max(t.seconds for t in given)
    prefix = {chain: [p for p in pieces if p.start_s < since] for chain, pieces in in_turn.items()}
    by_tape = {t.tape: t for t in given}
    last = [by_tape[p.tape] for pieces in in_turn.values() for p in pieces if p.start_s >= since]
    starts = {chain: ends[chain] + sum(p.seconds for p in prefix.get(chain, ())) for chain in ends}
    tail, tail_span = _shortest(starts, last)
    if tail_span >= in_turn_span:
        return in_turn, in_turn_span
    out = {chain: [*prefix.get(chain, ()), *tail.get(chain, ())] for chain in ends}
    return {chain: pieces for chain, pieces in out.items() if pieces}, tail_span


def _shortest(ends, tapes):
    """The layout of `tapes` that ends first: whole, longest first, or cut (McNaughton)."""
    tapes = sorted(tapes, key=lambda t: (-t.seconds, str(t.tape)))
    whole, whole_span = _list_schedule(ends, tapes)
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


def _list_schedule(ends, tapes, allocation=None):
    """Each tape whole, in the order given, to the chain that frees first (with an allocation,
    the tape it picks)."""
    if allocation and allocation.limits:
        return _allocated(ends, tapes, allocation)
    heap = [(end, str(chain), chain) for chain, end in ends.items()]
    heapq.heapify(heap)
    out = {}
    for tape in tapes:
        end, name, chain = heapq.heappop(heap)
        out.setdefault(chain, []).append(Piece(tape.tape, tape.keys, tape.seconds, end, tape.group))
        heapq.heappush(heap, (end + tape.seconds, name, chain))
    return out, max(end for end, _, _ in heap)


def _allocated(ends, tapes, allocation):
    heap = [(end, str(chain), chain) for chain, end in ends.items()]
    heapq.heapify(heap)
    left = list(tapes)
    out = {}
    span = max(ends.values())
    while left:
        at, name, chain = heapq.heappop(heap)
        i = allocation.pick(left, allocation.running(out, chain, at))
        if i is None:
            later = allocation.next_end(out, chain, at)
            if later is not None:
                heapq.heappush(heap, (later, name, chain))
                continue
            i = 0  # nothing else runs: a most of 0 cannot hold work forever in a plan
        tape = left.pop(i)
        out.setdefault(chain, []).append(Piece(tape.tape, tape.keys, tape.seconds, at, tape.group))
        span = max(span, at + tape.seconds)
        heapq.heappush(heap, (at + tape.seconds, name, chain))
    return out, span


def _fill(ends, tapes, limit):
    """McNaughton's fill up to `limit`, or None when the tapes do not fit. The chains busy the
    longest are filled first: a cut tape's tail then goes to a chain that frees earlier, where
    it can be read before its head starts (chains busy past `limit` take nothing)."""
    chains = sorted((c for c in ends if ends[c] < limit), key=lambda c: (-ends[c], str(c)))
    if not chains:
        return None
    out = {c: [] for c in chains}
    c = 0
    used = ends[chains[0]]
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
