from django.core.management.base import BaseCommand, CommandError

from carousel.domain.accounts import AccountError, api_token


class Command(BaseCommand):
    help = "Print a user's API token, created when missing (--rotate: replace it)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--rotate", action="store_true", help="replace the token; the old one stops working")

    def handle(self, *args, username, rotate, **options):
        try:
            self.stdout.write(api_token(username, rotate=rotate))
        except AccountError as exc:
            raise CommandError(str(exc)) from exc
