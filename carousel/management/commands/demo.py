from django.core.management.base import BaseCommand
from django.utils import timezone

from carousel.demo import demo_accounts, demo_requests


class Command(BaseCommand):
    help = "Create the demo accounts (printed) and, on an empty queue, demo restore requests."

    def add_arguments(self, parser):
        parser.add_argument("--no-requests", action="store_true", help="accounts only")

    def handle(self, *args, no_requests=False, **options):
        self.stdout.write("Demo accounts (user / password / API token):")
        for username, password, token, staff in demo_accounts():
            role = "  operator: admin and all requests" if staff else ""
            self.stdout.write(f"  {username:9} {password:15} {token}{role}")
        if not no_requests:
            n = demo_requests(now=timezone.now())
            if n:
                self.stdout.write(f"Submitted {n} demo restore requests.")
