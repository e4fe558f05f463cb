"""The usage page: the report of carousel/ops/usage.py for a period, per user or group, with a CSV
export. Those with the view permission on usage see every line; others their own (or their groups')."""
from datetime import datetime, time, timedelta, timezone as dt_timezone

from django import forms
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.utils import timezone

from carousel.domain import policy
from carousel.ops import usage
from carousel.outlook.shares import period_name


class PeriodForm(forms.Form):
    since = forms.DateField(required=False, label="From (UTC day)", widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, label="To (UTC day, included)",
                            widget=forms.DateInput(attrs={"type": "date"}))
    by = forms.ChoiceField(choices=[("user", "per user"), ("group", "per group"), ("activity", "per activity")],
                           required=False, label="Lines")

    def clean_since(self):
        return _in_range(self.cleaned_data["since"])

    def clean_until(self):
        return _in_range(self.cleaned_data["until"])

    def clean(self):
        data = super().clean()
        today = timezone.now().date()
        until = data.get("until") or today
        since = data.get("since") or usage.default_since(_midnight(until + timedelta(days=1))).date()
        if since > until:
            raise forms.ValidationError("The first day must not be after the last.")
        data.update(since=since, until=until, by=data.get("by") or "user")
        return data

    def period(self):
        d = self.cleaned_data
        return _midnight(d["since"]), _midnight(d["until"] + timedelta(days=1)), d["by"]


def _midnight(day):
    return datetime.combine(day, time(), dt_timezone.utc)


def _in_range(day):
    message = day and usage.out_of_range(datetime.combine(day, time(), dt_timezone.utc))
    if message:
        raise forms.ValidationError(message)
    return day


@login_required
def usage_page(request):
    form = PeriodForm(request.GET or None)
    sees_all = policy.may_see_all_usage(request.user)
    if request.GET and not form.is_valid():
        # Who sees what is said on the error page too (it told an operator "your own requests").
        return render(request, "frontend/usage.html", {"form": form, "sees_all": sees_all}, status=400)
    if not request.GET:
        form = PeriodForm({})
        form.is_valid()
    since, until, by = form.period()
    now = timezone.now()
    report = usage.usage_report(since=since, until=until, by=by, viewer=request.user, now=now)
    if request.GET.get("format") == "csv":
        response = HttpResponse(usage.usage_csv(report), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = (f'attachment; filename="carousel-usage-{by}-{since:%Y%m%d}-'
                                           f'{until:%Y%m%d}.csv"')
        return response
    query = request.GET.copy()
    query["format"] = "csv"
    largest = max((line.restored_bytes for line in report.lines), default=0)
    rows = [(line, round(100 * line.restored_bytes / largest) if largest else 0, round(100 * line.drive_share))
            for line in report.lines]
    return render(request, "frontend/usage.html", {"form": form, "report": report, "rows": rows,
                                                   "share_period": period_name(since, until, now),
                                                   "csv_query": query.urlencode(),
                                                   "sees_all": sees_all})
