"""The money ledger: one line per claim of a job on a provider record (engine/ledger.py
writes it; docs/money.md)."""

from django.db import models
from django.db.models import Q


class Charge(models.Model):
    """A claim's reservation and how it ended. Reserved at the claim, in the claim's
    transaction, at the estimate; then, exactly once (compare-and-set on `state`): settled
    (the provider's reported figure, else the estimate), released (not billed), or held as
    possibly charged (the answer was lost). Ids, not foreign keys: a line outlives its job,
    project and provider record."""

    class State(models.TextChoices):
        RESERVED = "reserved"
        SETTLED = "settled"
        RELEASED = "released"
        HELD = "held"  # possibly charged: counted as spent, never settled twice

    claim_token = models.UUIDField(unique=True)
    job_id = models.UUIDField()
    project_id = models.IntegerField(null=True, blank=True)
    provider_id = models.IntegerField()
    owner_id = models.IntegerField(null=True, blank=True)
    model = models.CharField(max_length=200, blank=True, default="")
    currency = models.CharField(max_length=10)
    unit = models.CharField(max_length=20, blank=True, default="")
    # The estimate at the claim; null when the price is unknown.
    reserved = models.DecimalField(max_digits=18, decimal_places=6, null=True, blank=True)
    state = models.CharField(max_length=10, choices=State.choices, default=State.RESERVED)
    # What the line ends at: settled's figure (null: unknown), 0 when released.
    amount = models.DecimalField(max_digits=18, decimal_places=6, null=True, blank=True)
    source = models.CharField(max_length=10, blank=True, default="")  # "provider" | "estimate"
    reason = models.CharField(max_length=300, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [
            models.Index(fields=["provider_id", "created_at"], name="charge_provider_time"),
            models.Index(fields=["project_id", "created_at"], name="charge_project_time"),
            models.Index(fields=["job_id"], name="charge_job"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(state="reserved", ended_at__isnull=True) | (~Q(state="reserved") & Q(ended_at__isnull=False)),
                name="charge_ended_iff_not_reserved",
            ),
            models.CheckConstraint(condition=Q(reserved__gte=0) | Q(reserved__isnull=True), name="charge_reserved_gte_0"),
        ]

    def __str__(self):
        return f"{self.state} {self.amount if self.amount is not None else self.reserved} {self.currency} for {self.job_id}"
