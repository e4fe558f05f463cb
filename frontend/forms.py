"""The pages' forms. Paths themselves are checked by the service (carousel/domain/paths.py), as for
the API; these forms only read them and the options."""
import codecs
from datetime import timedelta

from django import forms
from django.conf import settings

from carousel.models import ACTIVE_STATES, DestinationLayout, RequestState


NOT_UTF8 = "not UTF-8 text"


def read_lines(lines, *, limit):
    """The non-blank lines of `lines` (str or UTF-8 bytes, line endings kept or not), stripped,
    but for # comments: (paths, line numbers counted from 1, errors). A byte-order mark at the
    start (as Windows editors save UTF-8) is not part of the first path. The `carousel` command
    reads a file the same way. Stops after `limit` paths, enough for the service to refuse a
    list that is too long without reading all of it.

    Django decodes a posted text field with errors="replace", so bytes that are not UTF-8 reach
    the paste box as U+FFFD: a line holding it is refused as an upload's undecodable line is
    (in both, so that the paste box and the file agree), never queued mangled."""
    paths, numbers, errors = [], [], []
    for number, line in enumerate(lines, 1):
        if isinstance(line, bytes):
            try:
                line = line.decode("utf-8")
            except UnicodeDecodeError:
                errors.append({"line": number, "path": line[:200].decode("utf-8", "replace"), "message": NOT_UTF8})
                continue
        if "\ufffd" in line:
            errors.append({"line": number, "path": line[:200], "message": NOT_UTF8})
            continue
        if number == 1:
            line = line.removeprefix("\ufeff")
        line = line.strip()
        if line and not line.startswith("#"):  # a path starts with /: such a line is a comment
            paths.append(line)
            numbers.append(number)
            if len(paths) > limit:
                break
    return paths, numbers, errors


class RestoreForm(forms.Form):
    paths = forms.CharField(label="Paths, one per line", required=False, strip=False,
                            widget=forms.Textarea(attrs={"rows": 10, "spellcheck": "false", "autocomplete": "off"}))
    file = forms.FileField(label="… or a file listing them, one per line", required=False)
    destination = forms.CharField(label="Destination directory (optional)", required=False, max_length=4096,
                                  help_text="The directory the restored files are copied under: an absolute "
                                            "path under a root the operators allow you; empty: they stay where "
                                            "the tape system puts them.")
    destination_layout = forms.ChoiceField(
        label="Under the destination, each file goes", required=False, initial=DestinationLayout.PATH,
        choices=[(DestinationLayout.PATH, "by its whole path (/star/run1/a.root → DESTINATION/star/run1/a.root)"),
                 (DestinationLayout.NAME, "by its name alone (DESTINATION/a.root)")],
        help_text="By name, two files with the same name in one submission are refused, and nothing is stored.")
    pin_hours = forms.FloatField(label="Keep on disk for (hours, optional)", required=False, min_value=0.01,
                                 max_value=24 * 365)
    deadline = forms.DateTimeField(label="Give up after (UTC, optional)", required=False,
                                   input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M"],
                                   widget=forms.DateTimeInput(attrs={"type": "datetime-local"},
                                                              format="%Y-%m-%dT%H:%M"),
                                   help_text="Requests not restored by then are expired.")
    notify = forms.BooleanField(label="E-mail me when the whole submission is finished", required=False)

    def __init__(self, *args, has_email=True, **kwargs):
        super().__init__(*args, **kwargs)
        if not has_email:
            self.fields["notify"].help_text = ("Your account has no e-mail address: ask an operator to add one, "
                                               "or the notice has nowhere to go.")

    def clean(self):
        data = super().clean()
        if data.get("paths", "").strip() and data.get("file"):
            raise forms.ValidationError("Paste paths or choose a file, not both.")
        if not data.get("paths", "").strip() and not data.get("file"):
            raise forms.ValidationError("Paste at least one path, or choose a file listing them.")
        if "\x00" in data.get("destination", ""):
            self.add_error("destination", "contains a NUL byte")
        if data.get("file"):
            self._check_text(data["file"])
        return data

    def _check_text(self, upload):
        """A file that is not text at all is told so in one line, as `carousel submit --from-file`
        tells it (a UTF-16 list gave one "not UTF-8" line of mojibake)."""
        upload.seek(0)
        start = upload.read(4096)
        upload.seek(0)
        fix = "save it as UTF-8 text, one path a line"
        if start.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
            self.add_error("file", f"The file is UTF-16 text: {fix}.")
        elif b"\0" in start:
            self.add_error("file", f"The file is not a text file (it holds NUL bytes: binary, or UTF-16): {fix}.")

    def read_paths(self):
        """(paths, line numbers, errors) from the text or the uploaded file, which is read
        line by line from wherever Django spooled it, never whole into memory as text."""
        limit = settings.CAROUSEL_MAX_PATHS_PER_SUBMISSION
        upload = self.cleaned_data.get("file")
        return read_lines(upload if upload else self.cleaned_data["paths"].splitlines(), limit=limit)

    def options(self):
        data = self.cleaned_data
        hours = data.get("pin_hours")
        return {"destination": data.get("destination", ""),
                "destination_layout": data.get("destination_layout") or DestinationLayout.PATH,
                "deadline": data.get("deadline"),
                "pin_lifetime": timedelta(hours=hours) if hours else None, "notify": data.get("notify", False)}


class RequestFilter(forms.Form):
    state = forms.ChoiceField(label="State", required=False,
                              choices=[("", "any"), ("active", "active (not finished)"), *RequestState.choices])
    path = forms.CharField(label="Path contains", required=False, max_length=4096)
    bulk = forms.UUIDField(required=False, widget=forms.HiddenInput)
    after = forms.IntegerField(required=False, min_value=1, widget=forms.HiddenInput)

    def states(self):
        state = self.cleaned_data.get("state")
        if state == "active":
            return list(ACTIVE_STATES)
        return [state] if state else None


MAX_ID = 2**63 - 1  # ids are bigints


def parse_ids(values):
    """Request ids from form values; ValueError naming the first value that is not one
    (str.isdigit alone would let '²' through to int())."""
    ids = []
    for value in values:
        if not (value.isascii() and value.isdigit() and len(value) <= 19 and 1 <= int(value) <= MAX_ID):
            raise ValueError(f"{value[:30]!r} is not a request id")
        ids.append(int(value))
    return ids

