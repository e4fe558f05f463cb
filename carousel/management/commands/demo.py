from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from carousel.ops.demo import demo_accounts, demo_requests
from carousel.infra.deploy import is_embedded_database


class Command(BaseCommand):
    help = "Create the demo accounts (printed) and, on an empty queue, demo restore requests."

    def add_arguments(self, parser):
        parser.add_argument("--no-requests", action="store_true", help="accounts only")
        parser.add_argument("--any-database", action="store_true",
                            help="create them also in a database that is not the embedded default")

    def handle(self, *args, no_requests=False, any_database=False, **options):
        # The demo accounts have printed passwords and one is a superuser: never in a site's
        # database by accident.
        if not any_database and not is_embedded_database():
            raise CommandError(
                "refusing to create the demo accounts (known passwords, a superuser) in a database that is not "
                "the embedded default (DATABASE_URL is set). Create real accounts with `manage.py user`, or, for a "
                "throwaway database, ask for the demo: `manage.py demo --any-database` (`make run DEMO=1`).")
        self.stdout.write("Demo accounts (user / password / API token):")
        for username, password, token, staff in demo_accounts():
            role = "  operator: admin and all requests" if staff else ""
            self.stdout.write(f"  {username:9} {password:15} {token}{role}")
        if not no_requests:
            n = demo_requests(now=timezone.now())
            if n:
                self.stdout.write(f"Submitted {n} demo restore requests.")
