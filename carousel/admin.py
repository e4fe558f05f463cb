from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import ValidationError
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, User
from django.utils import timezone
from rest_framework.authtoken.admin import TokenAdmin
from rest_framework.authtoken.models import TokenProxy

from carousel.domain import policy, services
from carousel.tape import MEDIA
from carousel.tasks import withdraw_on_commit
from carousel.models import (
    Account, Bulk, Control, FileLocation, GroupShare, Job, PathPrefix, RestoreRequest, RetryQueue, StagerHealth, Tape,
    TapeMapEntry, Transition,
)


class ChecksSelection:
    """An action's selection is posted ids: one that is no id of the model (a forged 'abc', a
    NUL) failed the action's query with a 500. Refused here with a message, nothing changed."""

    def response_action(self, request, queryset):
        pk = self.model._meta.pk
        try:
            for value in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
                if "\x00" in value:
                    raise ValidationError("contains a NUL byte")
                pk.to_python(value)
        except ValidationError:
            self.message_user(request, "The selection names no object of this list: nothing was changed.",
                              messages.WARNING)
            return None
        return super().response_action(request, queryset)


class AccountInline(admin.StackedInline):
    model = Account
    can_delete = False
    verbose_name_plural = "limits and share group"


class GroupShareInline(admin.StackedInline):
    model = GroupShare
    can_delete = False
    verbose_name_plural = "share and cap"


admin.site.unregister(User)
admin.site.unregister(Group)


@admin.register(User)
class CarouselUserAdmin(ChecksSelection, UserAdmin):
    inlines = [AccountInline]


def masked_key(key):
    """An API token's key as shown to one who may not change the token: enough to tell two apart,
    not enough to use."""
    return f"{key[:4]}{'•' * 8}"


admin.site.unregister(TokenProxy)


@admin.register(TokenProxy)
class CarouselTokenAdmin(ChecksSelection, TokenAdmin):
    """DRF's token admin, but a token's key is shown only to those who may change the token: a
    viewer (an operator with the view permission alone) sees it masked, in the list, on the
    token's page, in its title and its history. A key is a password: whoever reads it acts as
    its user."""

    @admin.display(description="key")
    def shown_key(self, token):
        return token.key

    @admin.display(description="key")
    def hidden_key(self, token):
        return masked_key(token.key)

    def _key_column(self, request, token=None):
        return "shown_key" if self.has_change_permission(request, token) else "hidden_key"

    def get_list_display(self, request):
        return (self._key_column(request), "user", "created")

    def get_fields(self, request, obj=None):
        return ("user",) if obj is None else ("user", self._key_column(request, obj))

    def get_readonly_fields(self, request, obj=None):
        return ("shown_key", "hidden_key")

    def get_object(self, request, object_id, from_field=None):
        token = super().get_object(request, object_id, from_field)
        if token is not None and not self.has_change_permission(request, token):
            # The page's title, breadcrumbs and history name the token by its key (Token.__str__):
            # this viewer's copy carries the masked key. Never saved: viewing cannot save.
            token.key = masked_key(token.key)
        return token

    def delete_model(self, request, obj):
        # By its user, not its key: one who may delete but not change holds the masked copy.
        type(obj).objects.filter(user=obj.user).delete()


class PathPrefixInline(admin.TabularInline):
    model = PathPrefix
    extra = 1
    verbose_name_plural = ("path prefixes: what the group may restore (with the group-prefixes path "
                           "authorisation) and where its files may be delivered")


@admin.register(Group)
class CarouselGroupAdmin(ChecksSelection, GroupAdmin):
    inlines = [GroupShareInline, PathPrefixInline]


@admin.register(PathPrefix)
class PathPrefixAdmin(ChecksSelection, admin.ModelAdmin):
    list_display = ["prefix", "group", "purpose"]
    list_filter = ["purpose", "group"]
    search_fields = ["prefix", "group__name"]


class ControlForm(forms.ModelForm):
    """Policy names offered from the registries in settings, so a site's own policy appears
    here once it is named there."""

    class Meta:
        model = Control
        fields = "__all__"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for field, registry in (("sort_policy", "CAROUSEL_SORT_POLICIES"), ("share_policy", "CAROUSEL_SHARE_POLICIES")):
            if field not in self.fields:
                continue  # shown read-only: a viewer without the change permission
            names = sorted(getattr(settings, registry))
            self.fields[field] = forms.ChoiceField(choices=[(n, n) for n in names],
                                                   help_text=self.fields[field].help_text)

    def clean_policy_params(self):
        # Cleared (or null): no parameters, as a new row has; it was a NOT NULL error, a 500.
        value = self.cleaned_data.get("policy_params")
        return {} if value is None or value == "" else value


@admin.register(Control)
class ControlAdmin(ChecksSelection, admin.ModelAdmin):
    form = ControlForm
    readonly_fields = ["last_cycle_at", "last_cycle_error"]
    fieldsets = [
        ("Policies", {"fields": ["sort_policy", "share_policy", "policy_params", "max_wait_s"]}),
        ("Worth mounting", {"fields": ["mount_min_files", "mount_min_bytes", "mount_max_wait_s"]}),
        ("Mounts worth their wear", {
            "fields": ["min_mount_files", "min_mount_bytes", "remount_delay_s"],
            "description": "Applied by the mount planner between a cycle's candidate mounts, never leaving a drive "
                           "idle; the wait T above frees what they hold back (README, \"Mounts worth their wear\")."}),
        ("Batches", {"fields": ["files_per_job", "jobs_in_flight", "choose_per_cycle", "cycle_s", "locate_batch",
                                "locate_attempts", "locate_backoff_s", "paused"]}),
        ("Mount plan", {"fields": ["drives", "short_mount_s", "preempt_after_s", "preempt_gap_s"]}),
        ("Default caps", {"fields": ["default_user_cap", "default_group_cap", "default_queued_ceiling"]}),
        ("Retries", {"fields": ["retry_cycle_s", "max_attempts", "max_delivery_attempts"]}),
        ("Backpressure", {"fields": ["stall_after_s", "failure_ratio", "disk_threshold", "quarantine_failures",
                                     "quarantine_window_s"]}),
        ("Delivery", {"fields": ["deliveries_per_fs"]}),
        ("Jobs that never finish", {"fields": ["job_deadline_floor_s", "job_deadline_factor"]}),
        ("Last cycle", {"fields": ["last_cycle_at", "last_cycle_error"]}),
    ]
    list_display = ["__str__", "sort_policy", "share_policy", "paused", "last_cycle_at", "last_cycle_error"]

    def has_add_permission(self, request):
        return not Control.objects.exists()

    def has_delete_permission(self, request, obj=None):
        return False


class RestoreRequestForm(forms.ModelForm):
    """What an operator edits, checked as a submission checks it (services.request_options_check)."""

    def clean(self):
        data = super().clean()
        changed = set(self.changed_data)
        # Only what changes is checked: an unchanged deadline may have passed, a destination's
        # root may have gone since.
        given = {name: data.get(name) for name in ("priority", "deadline", "pin_lifetime", "destination")
                 if name in changed and name in data}
        try:
            destination = services.request_options_check(
                user=self.instance.user, now=timezone.now(), priority=given.get("priority", 0),
                deadline=given.get("deadline"), pin_lifetime=given.get("pin_lifetime"),
                destination=given.get("destination") or "")
        except (services.InvalidSubmission, services.NotAllowed) as exc:
            field = next((f for f in given if str(exc).startswith(f)), None)
            raise ValidationError({field: str(exc)} if field else str(exc)) from None
        if given.get("destination"):
            data["destination"] = destination
        return data


@admin.register(RestoreRequest)
class RestoreRequestAdmin(ChecksSelection, admin.ModelAdmin):
    form = RestoreRequestForm
    list_display = ["id", "path", "user", "state", "priority", "tape", "attempts", "error_class", "created_at",
                    "finished_at"]
    list_filter = ["state", "error_class", "priority"]
    search_fields = ["path", "user__username", "tape__label"]
    raw_id_fields = ["user", "tape", "job", "group"]
    list_select_related = ["user", "tape"]
    # Only what an operator may change by hand is editable, and only that is saved: the loop's
    # columns (state, job, attempts, ...) would otherwise be written back as the form read them,
    # undoing whatever the loop did meanwhile. States change through the actions.
    editable = ("priority", "deadline", "pin_lifetime", "destination")
    actions = ["cancel", "retry_now"]

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields if f.name not in self.editable]

    def save_model(self, request, obj, form, change):
        fields = [f for f in form.changed_data if f in self.editable]
        if fields:
            obj.save(update_fields=fields)

    def has_add_permission(self, request):
        return False  # requests come in through restore_submit (validation, no duplicates)

    def has_delete_permission(self, request, obj=None):
        # A request ends by the cancel action (withdrawn from the stager, its submission's counts
        # kept); retention prunes finished ones. Deleted by hand, a file in flight vanished from
        # its submission, which then showed as finished with it neither restored nor cancelled.
        return False

    # A million rows: count with an estimate-free but cheap query, never the full changelist count.
    show_full_result_count = False

    # Actions change rows: they need the change permission, as the edit form does.
    @admin.action(description="Cancel the selected requests", permissions=["change"])
    def cancel(self, request, queryset):
        # The one rule (carousel/domain/policy.py): with the change permission, anyone's.
        queryset = policy.actionable_requests(request.user, policy.CANCEL).filter(pk__in=queryset.values("pk"))
        count, pairs = services.request_cancel(queryset=queryset, now=timezone.now(),
                                               reason=f"cancelled by operator {request.user}")
        withdraw_on_commit(pairs)
        self.message_user(request, f"{count} request(s) cancelled.", messages.SUCCESS)

    @admin.action(description="Retry now (failed or waiting requests go back to the queue)", permissions=["change"])
    def retry_now(self, request, queryset):
        count = services.request_retry_now(queryset=queryset, now=timezone.now())
        self.message_user(request, f"{count} request(s) queued again.", messages.SUCCESS)


class QuarantinedFilter(admin.SimpleListFilter):
    title = "quarantine"
    parameter_name = "quarantined"

    def lookups(self, request, model_admin):
        return [("yes", "quarantined"), ("no", "in service")]

    def queryset(self, request, queryset):
        if self.value() in ("yes", "no"):
            return queryset.filter(quarantined_at__isnull=self.value() == "no")
        return queryset


class TapeForm(forms.ModelForm):
    """The technology is one the mount plan knows (carousel/tape.py, MEDIA) or empty: "LTO-99"
    was stored, and the tape's files then went out with no mount planned and no word. A name the
    stager reported is kept as it is."""

    class Meta:
        model = Tape
        fields = "__all__"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if "media" in self.fields:
            known = ["", *sorted(MEDIA)]
            current = self.instance.media if self.instance and self.instance.pk else ""
            if current not in known:
                known.append(current)
            self.fields["media"] = forms.ChoiceField(choices=[(m, m or "(unknown)") for m in known], required=False,
                                                     help_text="The tape's technology, as the drives read it.")

    def clean_label(self):
        # As load-tape-map takes one (a tab was stored here, a probe found).
        label = (self.cleaned_data.get("label") or "").strip()
        if not label or any(not ch.isprintable() for ch in label):
            raise forms.ValidationError("A label is 1 to 64 printable characters (no tab or line break).")
        return label

    def clean_used_bytes(self):
        used = self.cleaned_data.get("used_bytes")
        if used is not None and used < 0:
            raise forms.ValidationError("Bytes used on the tape cannot be negative.")
        return used


@admin.register(Tape)
class TapeAdmin(ChecksSelection, admin.ModelAdmin):
    form = TapeForm
    list_display = ["label", "media", "quarantined_at", "quarantine_reason", "recent_failures"]
    list_filter = [QuarantinedFilter, "media"]
    search_fields = ["label"]
    readonly_fields = ["recent_failures", "failures_since"]
    actions = ["lift_quarantine"]

    @admin.action(description="Lift the quarantine (the tapes' requests go out again)", permissions=["change"])
    def lift_quarantine(self, request, queryset):
        count = services.tape_lift_quarantine(queryset=queryset)
        self.message_user(request, f"{count} tape(s) back in service.", messages.SUCCESS)


@admin.register(StagerHealth)
class StagerHealthAdmin(ChecksSelection, admin.ModelAdmin):
    """What the loop judged of the stager at its last cycle: written by the loop only."""

    list_display = ["state", "reason", "since", "jobs_limit", "healthy_limit", "jobs_ceiling", "last_progress_at",
                    "disk", "preempted_at", "checked_at"]

    @admin.display(description="K (control)")
    def jobs_ceiling(self, obj):
        return Control.get().jobs_in_flight

    @admin.display(description="disk buffer free")
    def disk(self, obj):
        if not obj.disk_total_bytes or obj.disk_free_bytes is None:
            return "not reported"
        return f"{obj.disk_free_bytes / 1e9:,.0f} of {obj.disk_total_bytes / 1e9:,.0f} GB"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(RetryQueue)
class RetryQueueAdmin(ChecksSelection, admin.ModelAdmin):
    """Requests waiting for their retry time, soonest first."""

    list_display = ["id", "path", "user", "tape", "attempts", "error_class", "last_error", "retry_at"]
    list_filter = ["error_class"]
    search_fields = ["path", "user__username", "tape__label"]
    list_select_related = ["user", "tape"]
    ordering = ["retry_at"]
    actions = ["retry_now"]
    show_full_result_count = False

    def get_queryset(self, request):
        return super().get_queryset(request).filter(state="retry")

    @admin.action(description="Retry now", permissions=["retry"])
    def retry_now(self, request, queryset):
        count = services.request_retry_now(queryset=queryset, now=timezone.now())
        self.message_user(request, f"{count} request(s) queued again.", messages.SUCCESS)

    def has_retry_permission(self, request):
        # The list itself is read-only; retrying changes restore requests.
        return policy.may_change_all(request.user)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class LoopsRecord:
    """Rows the loop and the doors keep (their counts, keys and states follow what happened):
    shown, never added or changed by hand (a forged submission of 1,000 files showed as finished
    in its owner's list; a location whose key was not its path's was kept)."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(FileLocation)
class FileLocationAdmin(LoopsRecord, ChecksSelection, admin.ModelAdmin):
    """Deleting a wrong location stays possible: the file is located again when next asked for."""

    list_display = ["path", "tape", "position", "size", "located_at"]
    search_fields = ["path", "tape__label"]
    raw_id_fields = ["tape"]
    show_full_result_count = False


@admin.register(TapeMapEntry)
class TapeMapEntryAdmin(LoopsRecord, ChecksSelection, admin.ModelAdmin):
    """The site's tape map, as `manage.py load-tape-map` stored it (it is edited by loading)."""

    list_display = ["path", "tape", "media", "position", "size", "loaded_at"]
    search_fields = ["path", "tape"]
    show_full_result_count = False

    def has_delete_permission(self, request, obj=None):
        return False  # read only, as the README says: loading a map changes it


@admin.register(Bulk)
class BulkAdmin(LoopsRecord, ChecksSelection, admin.ModelAdmin):
    list_display = ["id", "user", "created_at", "files", "created"]
    search_fields = ["id", "user__username"]
    raw_id_fields = ["user", "submitter"]


@admin.register(Job)
class JobAdmin(ChecksSelection, admin.ModelAdmin):
    """Jobs are the loop's: shown, never edited by hand (a changed state or chain would
    contradict what the stager was told)."""

    list_display = ["id", "tape", "state", "chain", "files", "estimate_s", "jumps_queue", "after", "backend_id",
                    "created_at", "sent_at", "progress_at", "overdue_at"]
    list_filter = ["state", "jumps_queue"]
    raw_id_fields = ["tape", "after"]
    actions = ["give_up"]
    show_full_result_count = False

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        # The give-up action needs the change permission; one job's form never saves.
        return obj is None and super().has_change_permission(request)

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.action(description="Give up on the selected jobs (unfinished files back to the queue)",
                  permissions=["change"])
    def give_up(self, request, queryset):
        count, pairs = services.job_give_up(queryset=queryset, now=timezone.now(),
                                            reason=f"its job was given up by operator {request.user}")
        withdraw_on_commit(pairs)
        self.message_user(request, f"{count} job(s) given up.", messages.SUCCESS)


@admin.register(Transition)
class TransitionAdmin(ChecksSelection, admin.ModelAdmin):
    list_display = ["request", "from_state", "to_state", "at"]
    list_filter = ["to_state"]
    search_fields = ["request__path", "request__user__username"]
    raw_id_fields = ["request"]
    show_full_result_count = False

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


from carousel.models import WlcgGroupMap, WlcgIdentity  # noqa: E402 - the grid door's tables (issue 10)


@admin.register(WlcgGroupMap)
class WlcgGroupMapAdmin(ChecksSelection, admin.ModelAdmin):
    list_display = ["wlcg_group", "issuer", "group"]
    search_fields = ["wlcg_group", "issuer", "group__name"]


@admin.register(WlcgIdentity)
class WlcgIdentityAdmin(ChecksSelection, admin.ModelAdmin):
    list_display = ["subject", "issuer", "user", "created_at"]
    search_fields = ["subject", "issuer", "user__username"]
    raw_id_fields = ["user"]


from carousel.models import Activity, UnknownActivity  # noqa: E402 - activities (issue 23)


@admin.register(Activity)
class ActivityAdmin(ChecksSelection, admin.ModelAdmin):
    """The activity table: what each activity clients send means for its group's requests (the
    priority they get and the activity's weight in the group's share of drive time)."""
    list_display = ["name", "group", "priority", "weight"]
    list_editable = ["priority", "weight"]
    list_filter = ["group", "priority"]
    search_fields = ["name", "group__name"]


@admin.register(UnknownActivity)
class UnknownActivityAdmin(ChecksSelection, admin.ModelAdmin):
    """Activities clients sent that the table does not name for their group: their requests got
    the group's default. Adding one to the table applies to its later submissions."""
    list_display = ["name", "group", "first_seen", "last_seen", "in_table"]
    list_filter = ["group"]
    search_fields = ["name", "group__name"]
    readonly_fields = ["name", "group", "first_seen", "last_seen"]
    actions = ["add_to_table"]

    def has_add_permission(self, request):
        return False

    @admin.display(boolean=True, description="in the table now")
    def in_table(self, obj):
        from django.db.models import Q

        return Activity.objects.filter(Q(group__isnull=True) | Q(group_id=obj.group_id), name=obj.name).exists()

    @admin.action(description="Add to the activity table (the group's default priority and weight)",
                  permissions=["change"])
    def add_to_table(self, request, queryset):
        from carousel.domain import activities

        added = activities.unknown_adopt(queryset)
        self.message_user(request, f"{added} activities added to the table: edit their priority and weight there.")
