"""Replay a workload against the simulated tape library: the real loop and policies on a simulated
clock (or a baseline without the broker), and write the report of workloads/README.md.

The broker runs in a throwaway database, never the configured one: this command starts itself
again in a child process whose DATABASE_URL names a fresh SQLite file in a temporary directory
(`--database sqlite`, the default: no server, and the fastest here) or a temporary database on
the configured PostgreSQL server (`--database postgres`), migrates it, replays, and removes it.
Baselines need no database."""
import argparse
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from carousel.management.targets import check_output

from carousel.infra import plugins
from carousel.sim import plots, replay
from carousel.sim.library import Mismatch
from carousel.sim.workload import WorkloadError, load

CHILD_ENV = "CAROUSEL_REPLAY_CHILD"
TEMPLATE_ENV = "CAROUSEL_REPLAY_TEMPLATE"
PROGRESS_EVERY = 1000  # cycles


def _setting(text):
    name, sep, value = text.partition("=")
    if not sep or name not in replay.CONTROL_FIELDS:
        # argparse shows an ArgumentTypeError's words; a ValueError's were "invalid _setting value".
        raise argparse.ArgumentTypeError(f"{text!r}: expected FIELD=VALUE with FIELD one of "
                                         f"{', '.join(replay.CONTROL_FIELDS)}")
    try:
        return name, json.loads(value)
    except json.JSONDecodeError:
        return name, value


def _fraction(text):
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a fraction in [0, 1), e.g. 0.3")
    return value


class Command(BaseCommand):
    help = "Replay a workload (.json or .json.gz) through the broker and the simulated library; report as JSON."

    def add_arguments(self, parser):
        parser.add_argument("workload")
        parser.add_argument("--sort", help="sorting policy (a name in CAROUSEL_SORT_POLICIES)")
        parser.add_argument("--share", help="sharing policy (a name in CAROUSEL_SHARE_POLICIES)")
        parser.add_argument("--baseline", choices=replay.BASELINES, help="replay a baseline instead of the broker")
        parser.add_argument("--backend", choices=replay.BACKENDS, default="simulated",
                            help="the tape system behind the broker: simulated (it tells tapes, positions, drives) "
                                 "or hsm-fifo (it hides them, as through Tape REST; one FIFO recall queue)")
        parser.add_argument("--tape-map", action="store_true",
                            help="with --backend hsm-fifo: give the broker the workload's tapes as the site's tape map")
        parser.add_argument("--files-per-job", type=int, help="N of the control row")
        parser.add_argument("--jobs-in-flight", type=int, help="K of the control row")
        parser.add_argument("--cycle", type=float, help="cycle period of the control row, seconds")
        parser.add_argument("--set", type=_setting, action="append", default=[], metavar="FIELD=VALUE",
                            help="any other control field, e.g. default_user_cap=2000 (JSON values)")
        parser.add_argument("--mismatch", type=_fraction, default=0.0, metavar="P",
                            help="the library departs from the broker's model by up to P (0 <= P < 1): per tape "
                            "locate constants x U[1-P,1+P], bytes per wrap x U[1-P/15,1+P/15]; per drive read rate "
                            "x U[1-P/3,1+P/3]")
        parser.add_argument("--mismatch-seed", type=int, metavar="S",
                            help="the seed of the departed library (default 0); the same seed, the same library")
        parser.add_argument("--report", help="write the report here (default: print it)")
        parser.add_argument("--plot", help="draw the drive timeline, bytes and waits here (.png or .svg)")
        parser.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite",
                            help="where the throwaway database lives (postgres: on DATABASE_URL's server)")
        parser.add_argument("--here", action="store_true",
                            help="replay in the configured database, which must be a throwaway one with no requests")

    def handle(self, *args, **options):
        try:
            workload = load(options["workload"])
        except WorkloadError as exc:
            raise CommandError(f"malformed workload {options['workload']}: {exc}") from exc
        if options["plot"] and not options["plot"].lower().endswith(plots.FORMATS):
            raise CommandError(f"--plot {options['plot']}: the name must end with .png or .svg")
        # Checked before the replay, which may take half an hour: a report with nowhere to go
        # was lost at its end, a control value out of bounds failed in the child with a traceback.
        for option in ("report", "plot"):
            if options[option]:
                check_output(options[option], f"--{option}")
        self._check_control(self._control(options))
        for option, registry in (("sort", "CAROUSEL_SORT_POLICIES"), ("share", "CAROUSEL_SHARE_POLICIES")):
            if options[option]:
                try:
                    plugins.resolve(registry, options[option])
                except plugins.PluginError as exc:
                    raise CommandError(f"--{option}: {exc}") from exc
        if options["mismatch_seed"] is not None and not options["mismatch"]:
            raise CommandError("--mismatch-seed needs --mismatch P with P > 0")
        mismatch = Mismatch(options["mismatch"], options["mismatch_seed"] or 0) if options["mismatch"] else None
        if options["tape_map"] and options["backend"] != "hsm-fifo":
            raise CommandError("--tape-map is for a backend that hides its tapes: add --backend hsm-fifo")
        if options["baseline"]:
            if options["sort"] or options["share"]:
                raise CommandError("--sort and --share apply to the broker, not to a baseline")
            if options["backend"] != "simulated":
                raise CommandError("--backend applies to the broker, not to a baseline (baselines drive the library)")
            outcome = replay.replay_baseline(workload, options["baseline"], mismatch=mismatch)
            return self._finish(workload, outcome, options)
        if options["here"] or os.environ.get(CHILD_ENV):
            call_command("migrate", verbosity=0, interactive=False)
            _keep_template(os.environ.get(TEMPLATE_ENV))
            cycles = [0]

            def progress(now, report):
                cycles[0] += 1
                if options["verbosity"] and cycles[0] % PROGRESS_EVERY == 0:
                    self.stderr.write(f"{workload.name}: {cycles[0]} cycles, {now / 3600:.1f} simulated hours")

            try:
                outcome = replay.replay_broker(workload, control=self._control(options), progress=progress,
                                               mismatch=mismatch, backend=options["backend"],
                                               tape_map=options["tape_map"])
            except replay.ReplayError as exc:
                raise CommandError(str(exc)) from exc
            return self._finish(workload, outcome, options)
        # The child's progress and errors go straight to our stderr; its report comes back here.
        with throwaway_database(options["database"]) as env:
            child = subprocess.run([sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "simulate",
                                    *_as_arguments(options)], env=env, stdout=subprocess.PIPE, text=True)
        self.stdout.write(child.stdout, ending="")
        if child.returncode:
            raise CommandError(f"the replay failed (exit code {child.returncode}); its error is above")

    @staticmethod
    def _check_control(control):
        """Each control value as the control row takes it (CONTROL_BOUNDS, the admin's checks)."""
        from django.core.exceptions import ValidationError

        from carousel.models import Control

        fields = {f.name for f in Control._meta.fields}
        for name, value in control.items():
            try:
                if isinstance(value, float) and not math.isfinite(value):
                    raise ValidationError("Give a finite number.")  # nan passes every bound
                Control(**{name: value}).clean_fields(exclude=fields - {name})
            except ValidationError as exc:
                raise CommandError(f"the control row's {name} = {value!r}: {' '.join(exc.messages)}") from None

    def _control(self, options):
        control = dict(options["set"])
        for option, field in (("sort", "sort_policy"), ("share", "share_policy"), ("files_per_job", "files_per_job"),
                              ("jobs_in_flight", "jobs_in_flight"), ("cycle", "cycle_s")):
            if options[option] is not None:
                control[field] = options[option]
        return control

    def _finish(self, workload, outcome, options):
        try:
            result = replay.report(workload, outcome)
        except replay.ReplayError as exc:
            raise CommandError(str(exc)) from exc
        text = json.dumps(result, indent=2)
        if options["report"]:
            Path(options["report"]).write_text(text + "\n")
            self.stdout.write(summary(result))
        else:
            self.stdout.write(text)
        if options["plot"]:
            plots.plot(workload, outcome, result, options["plot"])


def summary(result):
    who = f"baseline {result['baseline']}" if result["baseline"] else (
        f"broker {result['policy']['sort']}/{result['policy']['share']}")
    if result.get("backend"):
        who += f" on {result['backend']}{' with the tape map' if result.get('tape_map') else ''}"
    if result.get("mismatch"):
        who += f" (mismatch {result['mismatch']} seed {result['mismatch_seed']})"
    return (f"{result['workload']} {who}: makespan {result['makespan_s']:.0f} s, lower bound "
            f"{result['lower_bound_s']:.0f} s (x{result['ratio_to_bound']:.2f}), {result['mounts']} mounts for "
            f"{result['tapes']} tapes, {result['throughput_mb_s']:.1f} MB/s, wall {result['wall_s']:.1f} s")


def _as_arguments(options):
    """The options again as a command line, for the child."""
    out = [options["workload"], "--verbosity", str(options["verbosity"])]
    for name in ("sort", "share", "files_per_job", "jobs_in_flight", "cycle", "report", "plot", "database",
                 "mismatch", "mismatch_seed", "backend"):
        if options.get(name) is not None:
            out += [f"--{name.replace('_', '-')}", str(options[name])]
    if options.get("tape_map"):
        out.append("--tape-map")
    for name, value in options["set"]:
        out += ["--set", f"{name}={json.dumps(value)}"]
    return out


def _template_path():
    """A migrated empty SQLite database, kept under VAR_DIR and named by the migrations it
    holds, so that a replay need not migrate from scratch (about a second each)."""
    from django.db.migrations.loader import MigrationLoader

    import django

    digest = hashlib.blake2b(django.get_version().encode(), digest_size=8)
    for (app, name), migration in sorted(MigrationLoader(None, ignore_no_migrations=True).disk_migrations.items()):
        digest.update(f"{app}.{name}".encode())
        digest.update(Path(sys.modules[migration.__module__].__file__).read_bytes())
    return Path(settings.VAR_DIR) / "replay-templates" / f"{digest.hexdigest()}.sqlite3"


def _keep_template(path):
    """Copy the freshly migrated database to `path` (the child's first job, when asked)."""
    if not path:
        return
    from django.db import connection

    connection.close()  # the last connection out folds SQLite's write-ahead log into the file
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    shutil.copyfile(connection.settings_dict["NAME"], partial)
    os.replace(partial, path)


@contextmanager
def throwaway_database(kind):
    """Environment variables for a child process that works in a database of its own."""
    with tempfile.TemporaryDirectory(prefix="carousel-replay-") as scratch:
        env = {**os.environ, CHILD_ENV: "1", "CAROUSEL_VAR_DIR": scratch}
        env.pop("REDIS_URL", None)
        if kind == "sqlite":
            database = Path(scratch) / "replay.sqlite3"
            env["DATABASE_URL"] = f"sqlite:///{database}"
            template = _template_path()
            if template.exists():
                shutil.copyfile(template, database)  # migrated already: migrate has nothing to do
            else:
                env[TEMPLATE_ENV] = str(template)
            yield env
            return
        url = os.environ.get("DATABASE_URL", "")
        if not url.startswith(("postgres://", "postgresql://")):
            raise CommandError("--database postgres needs DATABASE_URL to name a PostgreSQL server")
        import psycopg

        name = f"carousel_replay_{uuid.uuid4().hex[:12]}"
        parts = urlsplit(url)
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        env["DATABASE_URL"] = urlunsplit(parts._replace(path=f"/{name}"))
        try:
            yield env
        finally:
            with psycopg.connect(url, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
