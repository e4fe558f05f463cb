import os
import sys

from django.core.management.base import BaseCommand, CommandError

from carousel.domain.accounts import AccountError, api_token, ensure_user


class Command(BaseCommand):
    help = ("Create or update a user (idempotent): groups, staff, password, limits; --token prints the API "
            "token (created if missing), alone on stdout, for scripts.")

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--email")
        parser.add_argument("--group", action="append", dest="groups", metavar="GROUP",
                            help="repeatable: exactly these groups (they must exist); the first is the user's "
                                 "share group")
        parser.add_argument("--no-groups", action="store_true", help="remove the user from every group")
        parser.add_argument("--staff", action="store_true", default=None, help="may use the admin")
        parser.add_argument("--no-staff", action="store_false", dest="staff")
        parser.add_argument("--superuser", action="store_true", default=None)
        parser.add_argument("--no-superuser", action="store_false", dest="superuser")
        parser.add_argument("--password-env", metavar="VAR", help="set the password from this environment variable")
        parser.add_argument("--password-stdin", action="store_true", help="set the password from standard input")
        parser.add_argument("--inflight-cap", type=int, help="most requests in flight (0: the default)")
        parser.add_argument("--queued-ceiling", type=int, help="most active requests (0: the default)")
        parser.add_argument("--token", action="store_true", help="print the user's API token")

    def handle(self, *args, username, groups, no_groups, password_env, password_stdin, token, **opts):
        password = None
        if password_env:
            if password_env not in os.environ:
                raise CommandError(f"--password-env: {password_env} is not set")
            password = os.environ[password_env]
        elif password_stdin:
            password = sys.stdin.readline().rstrip("\n")
        if password == "":
            raise CommandError("empty password refused")
        try:
            ensure_user(username, email=opts["email"], groups=[] if no_groups else groups, staff=opts["staff"],
                        superuser=opts["superuser"], password=password, inflight_cap=opts["inflight_cap"],
                        queued_ceiling=opts["queued_ceiling"])
            if token:
                self.stdout.write(api_token(username))
        except AccountError as exc:
            raise CommandError(str(exc)) from exc
