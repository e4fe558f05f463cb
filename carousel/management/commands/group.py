from django.core.management.base import BaseCommand, CommandError

from carousel.domain.accounts import AccountError, ensure_group


class Command(BaseCommand):
    help = "Create or update a group and its share (idempotent)."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--weight", type=float, help="relative share under weighted sharing (GRPW)")
        parser.add_argument("--inflight-cap", type=int, help="most requests in flight for the group")

    def handle(self, *args, name, weight, inflight_cap, **options):
        try:
            ensure_group(name, weight=weight, inflight_cap=inflight_cap)
        except AccountError as exc:
            raise CommandError(str(exc)) from exc
