"""Admin for every model. State changes go through the same services as the app
(never `queryset.update(status=…)`), and provider keys are write-only."""

from django import forms
from django.contrib import admin, messages
from django.db import transaction
from django.db.models import Q

from queue_app import limits
from queue_app.engine import attempt_tally
from queue_app.models import (
    AccountSettings,
    AlbumItem,
    ApiToken,
    Heartbeat,
    IdempotencyKey,
    Job,
    JobAttempt,
    Project,
    ProjectEvent,
    ProjectRun,
    Provider,
    PushOutbox,
    PushSubscription,
    Status,
)
from queue_app.providers import crypto
from queue_app.services.errors import ServiceError
from queue_app.services.jobs import jobs_start
from queue_app.services.providers import concurrency_checked, provider_set_concurrency, provider_set_paused
from queue_app.web.forms import ProviderUrlMixin

admin.site.site_header = "Remix Studio Queue"
admin.site.index_template = "admin/queue_index.html"


class Admin(admin.ModelAdmin):
    """Every model admin of ours: JSON columns edited through the bounded field."""

    formfield_overrides = limits.ADMIN_FORMFIELDS


class ProviderForm(ProviderUrlMixin, forms.ModelForm):
    """The key fields are write-only: blank keeps the stored value, and the form shows
    at most the last four characters."""

    api_key = forms.CharField(required=False, widget=forms.PasswordInput(render_value=False), strip=True)
    api_secret = forms.CharField(required=False, widget=forms.PasswordInput(render_value=False), strip=True)

    class Meta:
        model = Provider
        fields = [
            "owner",
            "name",
            "family",
            "base_url",
            "options",
            "concurrency",
            "max_attempts",
            "paused",
            "cooldown_until",
            "model_aliases",
        ]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance and self.instance.pk:
            self.fields["api_key"].help_text = f"stored: {crypto.hint(self.instance.api_key) or 'none'} — leave blank to keep"
            self.fields["api_secret"].help_text = "leave blank to keep"

    def clean_concurrency(self):
        try:
            return concurrency_checked(self.cleaned_data.get("concurrency"))
        except ServiceError as error:
            raise forms.ValidationError(error.message) from None

    def save(self, commit=True):
        provider = super().save(commit=False)
        if self.cleaned_data.get("api_key"):
            provider.api_key = self.cleaned_data["api_key"]
        if self.cleaned_data.get("api_secret"):
            provider.api_secret = self.cleaned_data["api_secret"]
        if commit:
            provider.save()
        return provider


@admin.register(Provider)
class ProviderAdmin(Admin):
    form = ProviderForm
    list_display = ("name", "family", "owner", "concurrency", "paused", "cooldown_until", "key")
    list_editable = ("concurrency",)
    list_filter = ("family", "paused")
    search_fields = ("name",)
    actions = ["pause", "resume"]

    @admin.display(description="key")
    def key(self, obj):
        return crypto.hint(obj.api_key) or "—"

    # Admin actions need the change permission: a read-only operator (view permissions)
    # sees the lists, and Django hides an action its `permissions` do not grant.
    @admin.action(description="Pause selected providers", permissions=["change"])
    def pause(self, request, queryset):
        for provider in queryset:
            provider_set_paused(user=request.user, provider_id=provider.id, paused=True)

    @admin.action(description="Resume selected providers", permissions=["change"])
    def resume(self, request, queryset):
        for provider in queryset:
            provider_set_paused(user=request.user, provider_id=provider.id, paused=False)

    def save_model(self, request, obj, form, change):
        # Concurrency and pause go through their services so raising the one or resuming
        # dispatches at once (the queue service's timer would otherwise be the only net).
        through_services = [name for name in ("concurrency", "paused") if change and name in form.changed_data]
        wanted = {name: getattr(obj, name) for name in through_services}
        if through_services:
            stored = Provider.objects.get(pk=obj.pk)
            for name in through_services:
                setattr(obj, name, getattr(stored, name))
        super().save_model(request, obj, form, change)
        if "concurrency" in wanted:
            provider_set_concurrency(user=request.user, provider_id=obj.pk, concurrency=wanted["concurrency"])
        if "paused" in wanted:
            provider_set_paused(user=request.user, provider_id=obj.pk, paused=wanted["paused"])
        for name, value in wanted.items():
            setattr(obj, name, value)


@admin.register(Project)
class ProjectAdmin(Admin):
    list_display = ("name", "kind", "owner", "provider", "created_at")
    list_filter = ("kind",)
    search_fields = ("name",)


class JobAttemptInline(admin.TabularInline):
    model = JobAttempt
    extra = 0
    can_delete = False
    readonly_fields = ("number", "worker", "started_at", "finished_at", "outcome", "reason", "task_id")

    def has_add_permission(self, request, obj=None):
        return False


SNAPSHOT_FIELDS = (
    "status",
    "resolved",
    "active_provider",
    "slot",
    "lease_owner",
    "lease_token",
    "lease_expires_at",
    "attempts",
    "not_before",
    "error",
    "error_class",
    "task_id",
    "task_observed_at",
    "next_poll_at",
    "poll_claimed_until",
    "progress",
    "queued_at",
    "started_at",
    "finished_at",
)


class RunsOnFilter(admin.SimpleListFilter):
    """The provider record a job runs on: the one holding it, else its own choice, else its
    project's default (most jobs name none of their own, so `provider` alone finds few)."""

    title = "provider"
    parameter_name = "runs_on"

    def lookups(self, request, model_admin):
        return [(str(p.id), p.name) for p in Provider.objects.order_by("name").only("id", "name")]

    def queryset(self, request, queryset):
        if not self.value() or not self.value().isdigit():
            return queryset
        pid = int(self.value())
        held = Q(active_provider_id=pid)
        chosen = Q(active_provider__isnull=True, provider_id=pid)
        default = Q(active_provider__isnull=True, provider__isnull=True, project__provider_id=pid)
        return queryset.filter(held | chosen | default)


@admin.register(Job)
class JobAdmin(Admin):
    list_display = ("id", "project", "status", "provider", "model", "attempts", "short_task", "created_at")
    list_filter = ("status", RunsOnFilter, "project", "active_provider__family")
    search_fields = ("id", "task_id", "prompt", "project__name")
    readonly_fields = SNAPSHOT_FIELDS
    inlines = [JobAttemptInline]
    actions = ["start_or_retry"]

    @admin.display(description="task")
    def short_task(self, obj):
        return obj.task_id[:16]

    def delete_model(self, request, obj):
        self.delete_queryset(request, Job.objects.filter(pk=obj.pk))

    def delete_queryset(self, request, queryset):
        # the attempts' counts stay in the tallies (the /metrics counters never fall)
        with transaction.atomic():
            attempt_tally.fold_jobs(queryset.values_list("id", flat=True))
            queryset.delete()

    @admin.action(description="Start / retry selected jobs", permissions=["change"])
    def start_or_retry(self, request, queryset):
        started = 0
        for job in queryset.filter(status__in=(Status.DRAFT, Status.FAILED)).select_related("project", "owner"):
            try:
                started += len(jobs_start(user=job.owner, project=job.project, job_ids=[job.id])["started"])
            except ServiceError as error:
                self.message_user(request, f"{job.id}: {error.message}", messages.ERROR)
        self.message_user(request, f"{started} job(s) started")


@admin.register(JobAttempt)
class JobAttemptAdmin(Admin):
    list_display = ("job", "number", "worker", "outcome", "started_at", "finished_at")
    list_filter = ("outcome",)
    search_fields = ("job__id", "task_id")

    def delete_model(self, request, obj):
        self.delete_queryset(request, JobAttempt.objects.filter(pk=obj.pk))

    def delete_queryset(self, request, queryset):
        with transaction.atomic():  # the counts stay in the tallies (/metrics counters never fall)
            attempt_tally.fold(queryset)
            queryset.delete()


@admin.register(AlbumItem)
class AlbumItemAdmin(Admin):
    list_display = ("id", "project", "job", "output_index", "role", "kind", "size", "created_at")
    list_filter = ("kind", "role")


@admin.register(ProjectEvent)
class ProjectEventAdmin(Admin):
    list_display = ("project", "seq", "kind", "job_id", "status", "created_at")
    list_filter = ("kind",)


@admin.register(Heartbeat)
class HeartbeatAdmin(Admin):
    list_display = ("name", "role", "host", "pid", "started_at", "seen_at")


@admin.register(ProjectRun)
class ProjectRunAdmin(Admin):
    list_display = ("project", "opened_at", "closed_at", "total", "completed", "failed")
    list_filter = ("closed_at",)


class ReadOnlyAdmin(Admin):
    """Rows the app writes itself; the admin only looks (and may delete)."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(PushSubscription)
class PushSubscriptionAdmin(ReadOnlyAdmin):
    # The endpoint is a capability URL: never listed in full.
    list_display = ("id", "user", "push_service", "user_agent", "created_at", "last_used_at")
    exclude = ("endpoint", "p256dh", "auth")

    @admin.display(description="push service")
    def push_service(self, obj):
        from urllib.parse import urlsplit

        return urlsplit(obj.endpoint).hostname


@admin.register(PushOutbox)
class PushOutboxAdmin(ReadOnlyAdmin):
    list_display = ("id", "run", "subscription_id", "outcome", "attempts", "next_try_at", "sent_at")
    list_filter = ("outcome",)


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnlyAdmin):
    # Only a hash is stored; the prefix tells tokens apart.
    list_display = ("name", "owner", "prefix", "created_at", "last_used_at")
    exclude = ("token_hash",)


admin.site.register(AccountSettings, Admin)
admin.site.register(IdempotencyKey, Admin)
