"""Drive allocation: what an operator gave each group, and what each group reads on now."""
from django.db.models import Max, Q

from carousel.models import GroupShare, Job, JobState


def drive_allocation():
    """{group id: (reserved drives, most drives or None)} for the groups an operator gave a
    drive allocation (GroupShare); a most below 1 counts as 1."""
    return {g: (reserved, None if most is None else max(1, most)) for g, reserved, most in
            GroupShare.objects.filter(Q(reserved_drives__gt=0) | Q(max_drives__isnull=False))
            .values_list("group_id", "reserved_drives", "max_drives")}


def drives_in_use():
    """{group id: the drives' chains reading its mounts now (jobs sent)}."""
    used = {}
    for group, chain in (Job.objects.filter(state=JobState.SENT).exclude(chain="").order_by()
                         .values_list("group_id", "chain").distinct()):
        used.setdefault(group, set()).add(chain)
    return used


def last_unmounts(tape_ids, *, since):
    """{tape id: when its last mount ended} for the tapes of `tape_ids` read since `since`: the
    last of its jobs sent to the stager and finished since then (a finished job is the broker's
    sign that the library put the tape away; a tape with a job still on a drive is mounted).
    The wear rules (carousel/loop/wear.py) read it; one query, by the jobs' tape index."""
    return dict(Job.objects.filter(tape_id__in=list(tape_ids), sent_at__isnull=False, finished_at__gte=since)
                .order_by().values("tape_id").annotate(at=Max("finished_at")).values_list("tape_id", "at"))
