from django.core.management.base import BaseCommand
from django.utils import timezone

from carousel.loop.cycle import run_cycle


class Command(BaseCommand):
    help = "Run one cycle of the server loop now (the worker's beat does this every period)."

    def handle(self, *args, **options):
        self.stdout.write(str(run_cycle(now=timezone.now())))
