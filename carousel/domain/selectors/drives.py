"""Drive allocation: what an operator gave each group, and what each group reads on now."""
from django.db.models import Q

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
