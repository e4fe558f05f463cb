from datetime import timedelta

from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.utils import timezone

from carousel.loop.cycle import run_cycle
from carousel.models import RestoreRequest, Transition
from carousel.domain.services import restore_submit
from carousel.stagers.immediate import ImmediateStager


class Command(BaseCommand):
    help = "Smoke run of a fresh database: migrate, submit, run the loop, check the files were restored."

    def handle(self, *args, **options):
        call_command("migrate", verbosity=0, interactive=False)
        user, _ = User.objects.get_or_create(username="smoke")
        now = timezone.now()
        result = restore_submit(user=user, now=now, paths=["/smoke/a.root", "/smoke/b.root", "/smoke/a.root"])
        # The stager that restores at the next poll: this run checks the database side (COPY,
        # the lock, the triggers) of the embedded default, not the tape model.
        stager = ImmediateStager()
        first = run_cycle(now=now, stager=stager)
        second = run_cycle(now=now + timedelta(seconds=10), stager=stager)
        states = sorted(RestoreRequest.objects.filter(user=user).values_list("state", flat=True))
        history = Transition.objects.filter(request__user=user).count()
        self.stdout.write(f"{connection.vendor}: submitted {result.created}, cycle 1 sent {first.submitted}, "
                          f"cycle 2 restored {second.done}; states {states}; {history} transitions recorded")
        if states != ["done", "done"] or history != 4:
            raise CommandError("smoke run failed: the requests did not go queued -> submitted -> done")
        self.stdout.write("smoke run OK")
