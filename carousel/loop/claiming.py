"""Claiming: choose this cycle's requests with the policies, claim them, and commit them as
jobs (laid out on the drives' chains by mounts.MountPlanner when the drive count is known)."""
from collections import Counter

from django.db import transaction
from django.db.models import Exists, Max, OuterRef, Sum

from policies.order import read_order
from policies.selection import select
from policies.sorting import in_read_order

from carousel.infra.db import insert_rows, update_joined
from carousel.loop.locating import any_unlocated
from carousel.models import IN_FLIGHT_STATES, Job, JobState, RequestState as S, RestoreRequest, UserBacklog
from carousel.loop.mounts import Planned, mount_estimate_s
from carousel.domain.services import request_claim
from carousel.stagers.base import JobSpec
from carousel.tape import MEDIA, mount_profile


def files_at_stager():
    """The files planned or at the stager, each once however many users' requests share it
    (a rider or a joiner is in the same job as the request it joined), with its size (`bytes`):
    what the window (N x K files) and the disk buffer's incoming bytes count. Counting requests,
    ten users asking for the same 20 files held 200 places of the window, and nothing else
    was sent while the stager had room."""
    return (RestoreRequest.objects.filter(state__in=IN_FLIGHT_STATES).order_by()
            .values("job_id", "path_key").annotate(bytes=Max("size")))


def claim_jobs(*, now, control, sort, share, jobs_limit=None, byte_budget=None, drives=None, turns=None):
    """Choose this cycle's requests with the active policies, claim them, group them into
    jobs of at most N files per tape in read order, and commit jobs and claims together.
    Claiming locks with SKIP LOCKED and re-checks the state, so two cycles can never send the
    same request. Slots: N files times the jobs allowed in flight (the adaptive limit, K by
    default), less the files planned or in flight, at most `choose_per_cycle`; and no more
    bytes than `byte_budget`, when given. With `drives` (a MountPlanner), the jobs are laid
    out on the drives' chains (carousel/loop/plan.py), and while the backlog is larger than the
    window only the long mounts the chains lack are chosen (mounts.MOUNTS_AHEAD). `turns`: the turn
    policy (policies/turns.py), by default the configured one."""
    jobs_limit = control.jobs_in_flight if jobs_limit is None else jobs_limit
    window = control.files_per_job * jobs_limit - files_at_stager().count()
    slots = min(window, control.choose_per_cycle)
    # The whole backlog fits in the window. Not while requests wait to be located: a burst
    # larger than a locate batch is not all ready yet, and taking what is would hand the
    # drives to whoever was located first.
    fits = _ready_backlog() <= window and not any_unlocated()
    if window > slots and fits:
        # Choose it all now, so the plan sees all of it and cuts its last tapes across the
        # drives (plan.py), instead of committing whole tapes one cycle's choice at a time.
        # Still bounded by N x K.
        slots = window
    # Once the work in flight is done, a cycle has the whole window (at most its choice).
    most = min(control.files_per_job * jobs_limit, max(slots, control.choose_per_cycle))
    # With the plan on and more work waiting than the window holds, only the mounts the
    # drives' chains lack are chosen (mounts.MOUNTS_AHEAD): the turns are taken as drives
    # free up, against the drive time really held.
    mounts = drives.mounts_wanted() if drives is not None and not fits and slots > 0 else None
    selection = select(now=now, control=control, sort=sort, share=share, slots=slots, most_slots=most,
                       mounts=mounts, turns=turns)
    if byte_budget is not None:
        selection.chosen = _within(selection.chosen, byte_budget)
    if not selection.chosen:
        if drives is not None and drives.rebalance_due():
            # The final round laid out again (MountPlanner._take_back): the same requests on
            # new jobs, none newly submitted.
            with transaction.atomic():
                _make_jobs([], {}, {}, now=now, control=control, drives=drives)
        return []
    staged_elsewhere = RestoreRequest.objects.filter(path_key=OuterRef("path_key"), state__in=IN_FLIGHT_STATES)
    with transaction.atomic():
        # FOR NO KEY UPDATE, here and wherever a request row is locked to change its state: a
        # submission that links an existing request to its BulkItem takes FOR KEY SHARE on it
        # (the foreign key's check), which plain FOR UPDATE blocks; the stress run saw the two
        # deadlock. No request's key ever changes, so nothing is lost by the weaker lock.
        claimed = dict(
            (i, (path, key)) for i, path, key in
            RestoreRequest.objects.filter(id__in=[c.id for c in selection.chosen], state=S.QUEUED)
            .exclude(Exists(staged_elsewhere)).exclude(tape__quarantined_at__isnull=False)
            .select_for_update(skip_locked=True, of=("self",), no_key=True)
            .values_list("id", "path", "path_key")
        )
        chosen = [c for c in selection.chosen if c.id in claimed]
        return _make_jobs(chosen, claimed, selection.tapes, now=now, control=control, drives=drives)


def _merge_into_pending(pieces, tapes, files_per_job, drives, short_mount_s):
    """New files of a tape whose mount is planned but not sent yet go into that job, the
    union in the order its stager reads (MountPlanner.order): one pass along the tape, not a second job read after the first
    (files of one tape requested over a few cycles, as an analysis's requests trickle in, would
    otherwise be read in two or three passes of the same mount). Only while the union is at
    most N files; beyond, the new files make a job of their own that is sent with it. Returns
    {path key: (job id, rank)} for every file of the merged jobs, and sets each merged piece's
    `last_job`; the jobs' counts, estimates and short-mount flags are updated here."""
    joins = {p.join: p for p in pieces if p.join is not None}
    if not joins:
        return {}
    held = {}
    for job, path, key, position, size in (RestoreRequest.objects.filter(job_id__in=list(joins),
                                           state__in=IN_FLIGHT_STATES).order_by("job_rank")
                                           .values_list("job_id", "path", "path_key", "position", "size")):
        held.setdefault(job, {}).setdefault(key, (path, key, position or 0, size or 0))
    # The other jobs of each short mount joined (one of more than N files is several jobs, all
    # waiting on the same step; new files join the last): the mount is short or long as a whole.
    parts = {}
    jumping = [p for p in joins.values() if p.jumps]
    if jumping:
        for tape, chain, seconds in (Job.objects.filter(state=JobState.PENDING, jumps_queue=True,
                                                        tape_id__in={p.tape for p in jumping},
                                                        chain__in={p.chain for p in jumping})
                                     .exclude(id__in=list(joins)).order_by().values_list("tape_id", "chain")
                                     .annotate(s=Sum("estimate_s")).values_list("tape_id", "chain", "s")):
            parts[(tape, chain)] = seconds or 0.0
    placed, counts, grown = {}, [], []
    for job, piece in joins.items():
        files = dict(held.get(job, {}))
        files.update((f[1], f) for f in piece.files if f[1] not in files)
        if len(files) > files_per_job:
            continue
        media = tapes[piece.tape].media if piece.tape in tapes else None
        places = [(k, f[2], f[3]) for k, f in files.items()]
        order = drives.order(media, places) if drives is not None else read_order(media, places)
        placed.update((key, (job, rank)) for rank, key in enumerate(order))
        estimate = piece.estimate_s
        if drives is not None and media in MEDIA:
            pre, _ = mount_profile(media, [(files[k][2], files[k][3]) for k in order],
                                   read_rate_mb_s=drives.read_rate_mb_s, exchange_s=drives.exchange_s)
            estimate = pre[-1]
        # A short mount the new files make long (those that fit in its job; more than N make a
        # job of their own, judged at the next join) is a long one from then on, every job of
        # it: it keeps its place on the chain, but no longer cuts the mount it waits for
        # (preempt), a later short mount goes ahead of it, and it counts among the drive's long
        # mounts. (overlap's burst stretched over a minute made tapes' first mounts short, then
        # long: 15 cuts, 51 mounts for 30 tapes where 36 do.) The whole is this job re-estimated
        # plus the others' estimates: a mount of several jobs counts its fixed costs twice, on
        # the long side.
        jumps = piece.jumps and parts.get((piece.tape, piece.chain), 0.0) + estimate <= short_mount_s
        if piece.jumps and not jumps:
            grown.append((piece.tape, piece.chain))
        counts.append((job, len(files), estimate, jumps))
        piece.last_job = job
    update_joined(Job, counts, on=("id",), columns=("files", "estimate_s", "jumps_queue"),
                  where={"state": JobState.PENDING})
    for tape, chain in grown:
        Job.objects.filter(state=JobState.PENDING, jumps_queue=True, tape_id=tape, chain=chain).update(
            jumps_queue=False)
    # The files the job held keep their job and take their new place in it.
    update_joined(RestoreRequest, [(key, rank) for key, (_, rank) in placed.items()], on=("path_key",),
                  columns=("job_rank",), where={"job_id": list(joins), "state": IN_FLIGHT_STATES})
    return placed


def _ready_backlog():
    """Ready requests of all users, from the trigger-kept counters (no scan of the queue)."""
    return UserBacklog.objects.aggregate(n=Sum("files"))["n"] or 0


def _within(chosen, byte_budget):
    """The first chosen requests, in sending order, whose sizes fit in the budget."""
    kept, used = [], 0
    for c in chosen:
        used += c.size
        if used > byte_budget:
            break
        kept.append(c)
    return kept


def _make_jobs(chosen, claimed, tapes, *, now, control, drives=None):
    """Tapes in the order the policies chose them; each tape's files in read order (position
    order behind a stager that hides its drives: MountPlanner.lay_out), at most
    N (control.files_per_job) distinct files per job. With `drives`, each tape's work is a piece of a
    drive's chain (MountPlanner); a piece longer than N files is several jobs sent together.
    All jobs in one INSERT, all claims in one UPDATE, the chains' links in one more."""
    by_tape = {}
    for c in chosen:
        by_tape.setdefault(c.tape, []).append(c)
    ordered = {}  # tape -> [(path, key, position, size)] in read order, one per file
    users = {tape_id: Counter(c.user for c in candidates) for tape_id, candidates in by_tape.items()}
    # The group whose drive time a tape's mount is: most of its requests'.
    groups = {tape_id: Counter(c.group for c in candidates).most_common(1)[0][0]
              for tape_id, candidates in by_tape.items()}
    for tape_id, candidates in by_tape.items():
        files = {}
        for c in in_read_order(candidates, tapes):
            files.setdefault(claimed[c.id], (*claimed[c.id], c.position or 0, c.size or 0))
        ordered[tape_id] = list(files.values())
    if drives is not None:
        priorities = {tape_id: max(c.priority for c in candidates) for tape_id, candidates in by_tape.items()}
        pieces = drives.lay_out(ordered, tapes, users, control=control, groups=groups, now=now,
                                priorities=priorities)
    else:
        pieces = [Planned(tape_id, files,
                          estimate_s=mount_estimate_s(tapes[tape_id].media, [(f[2], f[3]) for f in files]))
                  for tape_id, files in ordered.items()]
    files_per_job = control.files_per_job
    jobs, job_of_key, rank_of_key = [], {}, {}
    merged = _merge_into_pending(pieces, tapes, files_per_job, drives, control.short_mount_s)
    job_of_key.update((key, job) for key, (job, _) in merged.items())
    rank_of_key.update((key, rank) for key, (_, rank) in merged.items())
    for piece in pieces:
        if piece.last_job is not None:
            continue  # merged into its tape's pending job
        # A piece after another one planned in this cycle follows that one's last job.
        after = piece.after.last_job if isinstance(piece.after, Planned) else piece.after
        # (Behind a stager that hides its drives the files are in position order already
        # (MountPlanner.order): parts of N are stretches along the tape.)
        for start in range(0, len(piece.files), files_per_job):
            part = piece.files[start:start + files_per_job]
            job = Job(tape_id=piece.tape, files=len(part), created_at=now, rank=len(jobs), chain=piece.chain,
                      group_id=groups.get(piece.tape),
                      after_id=after, jumps_queue=piece.jumps, estimate_s=piece.estimate_s * len(part) / len(piece.files))
            jobs.append((job, part))
            job_of_key.update((f[1], job.id) for f in part)
            rank_of_key.update((f[1], rank) for rank, f in enumerate(part))
            piece.last_job = job.id
    if not jobs and not merged:
        return []
    # By COPY on PostgreSQL (db.insert_rows): a cycle makes up to a job per claimed file.
    columns = [f.attname for f in Job._meta.concrete_fields]
    if jobs:
        insert_rows(Job, columns, ([getattr(job, c) for c in columns] for job, _ in jobs), ids=False)
    # Each file's job and its place in it, for the UPDATEs that join them (db.update_joined).
    placed = [(key, job, rank_of_key[key]) for key, job in job_of_key.items()]
    taken_back = drives.taken_back if drives is not None else set()
    if taken_back:  # planned again (MountPlanner.lay_out): their requests move to the new jobs
        update_joined(RestoreRequest, placed, on=("path_key",), columns=("job_id", "job_rank"),
                      where={"job_id": list(taken_back), "state": IN_FLIGHT_STATES})
        Job.objects.filter(id__in=list(taken_back)).delete()
    # A short mount put before the long ones: the long ones that followed what it follows now
    # follow it (and a later short one on the same chain, which follows the earlier one, takes
    # them over in turn). Resolved here in piece order, written in one UPDATE.
    relinked = {}  # (chain, job followed before this cycle) -> job followed now
    holders = {}  # (chain, job followed now) -> the jobs followed before that moved to it
    for piece in pieces:
        if piece.jumps and piece.after is not None and piece.last_job != piece.join:
            before = piece.after.last_job if isinstance(piece.after, Planned) else piece.after
            moved = holders.pop((piece.chain, before), [])
            if (piece.chain, before) not in relinked:  # its followers have not moved yet
                moved.append(before)
            relinked.update(((piece.chain, old), piece.last_job) for old in moved)
            holders.setdefault((piece.chain, piece.last_job), []).extend(moved)
    update_joined(Job, [(*key, job) for key, job in relinked.items()], on=("chain", "after_id"), columns=("after_id",),
                  where={"state": JobState.PENDING, "jumps_queue": False}, exclude={"created_at": now})
    # Files that joined their tape's mount on a drive went out at once: what waited on that
    # drive behind the tape's earlier jobs now waits for them too, not going out (to wait in
    # the library's queue, or take another drive out of its turn) while the drive still reads.
    for piece in pieces:
        if piece.rides and piece.last_job is not None:
            Job.objects.filter(state=JobState.PENDING, chain=piece.chain, after__tape_id=piece.tape,
                               after__state=JobState.SENT, after__chain=piece.chain).exclude(
                tape_id=piece.tape).update(after_id=piece.last_job)
    # Other users' queued requests for the same files ride along in the same stage.
    request_claim(placed, now=now)
    return [JobSpec(id=str(job.id), paths=[f[0] for f in part]) for job, part in jobs]
