"""Structured logs: one JSON object per line for machines (production, CAROUSEL_LOG_FORMAT=json),
one readable line for a person in a terminal (`make run`; the default when stderr is a TTY).

Context ids travel with the code that runs: `log_context(cycle=..., job=...)` binds them for a
block (contextvars, so threads and tasks keep their own), and the Celery worker binds `cycle`
(the cycle task's id) for each cycle it runs (carousel/celery.py). A log call can add its own:
`log.warning("...", extra={"job": job.id, "request": request.id})`. Both end up as keys of the
JSON object; ids never go into the message's place in Prometheus labels or elsewhere."""
import contextlib
import contextvars
import json
import logging
import os
import sys
from datetime import datetime, timezone

_context = contextvars.ContextVar("carousel_log_context", default={})
# The keys a log line may carry besides the standard ones, in the order they are shown.
CONTEXT_KEYS = ("cycle", "job", "request", "bulk", "tape", "task")
_STANDARD = set(vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None))) | {"message", "asctime"}


@contextlib.contextmanager
def log_context(**ids):
    """Bind ids (cycle, job, request, ...) to every log line written inside the block."""
    token = _context.set({**_context.get(), **{k: v for k, v in ids.items() if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


def bind(**ids):
    """Bind ids until unbind(token): for signal handlers that open and close apart."""
    return _context.set({**_context.get(), **ids})


def unbind(token):
    _context.reset(token)


def _fields(record):
    """The context ids, then the record's own extras."""
    fields = dict(_context.get())
    fields.update({k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")})
    return fields


class JsonFormatter(logging.Formatter):
    def format(self, record):
        entry = {"ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
                 "level": record.levelname, "logger": record.name, "msg": record.getMessage()}
        for key, value in _fields(record).items():
            entry.setdefault(key, value)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        # default=str: UUIDs, datetimes; json.dumps escapes newlines, so one object is one line.
        return json.dumps(entry, default=str, ensure_ascii=False)


class ConsoleFormatter(logging.Formatter):
    def format(self, record):
        fields = _fields(record)
        ordered = [k for k in CONTEXT_KEYS if k in fields] + sorted(k for k in fields if k not in CONTEXT_KEYS)
        tail = " ".join(f"{k}={fields[k]}" for k in ordered)
        line = (f"{datetime.fromtimestamp(record.created):%H:%M:%S} {record.levelname:<7} {record.name}: "
                f"{record.getMessage()}" + (f"  [{tail}]" if tail else ""))
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def log_format():
    """json or text: CAROUSEL_LOG_FORMAT, else text in a terminal and JSON elsewhere."""
    chosen = os.environ.get("CAROUSEL_LOG_FORMAT", "auto").lower()
    if chosen in ("json", "text"):
        return chosen
    return "text" if sys.stderr.isatty() else "json"


def logging_config(level="INFO"):
    """The LOGGING setting: carousel's loggers at `level`, everything else (Django, Celery) at
    WARNING, all through one handler on stderr in the chosen format."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": JsonFormatter}, "text": {"()": ConsoleFormatter}},
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": log_format()}},
        "root": {"handlers": ["console"], "level": "WARNING"},
        "loggers": {
            "carousel": {"handlers": ["console"], "level": level, "propagate": False},
            # runserver's request lines, readable or JSON like the rest.
            "django.server": {"handlers": ["console"], "level": "INFO", "propagate": False},
        },
    }
