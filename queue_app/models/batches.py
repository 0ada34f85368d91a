"""What batches of drafts are made from: a project's workflow (the items the combinations
generator crosses) and a user's named wildcard lists (`__colours__` in a prompt)."""

from django.conf import settings
from django.db import models


class ProjectWorkflow(models.Model):
    """A project's ordered workflow items, each {"type", "value", "enabled"}; checked by
    `services.combinations.workflow_checked` before it is stored."""

    project = models.OneToOneField("queue_app.Project", on_delete=models.CASCADE, related_name="workflow")
    items = models.JSONField(default=list, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self):
        return f"workflow of {self.project_id}"


class WildcardList(models.Model):
    """A named list of alternatives; `__name__` in a prompt stands for one of them."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="wildcard_lists")
    name = models.CharField(max_length=60)
    values = models.JSONField(default=list, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="wildcard_list_owner_name")]

    def __str__(self):
        return f"__{self.name}__"


class PromptTemplate(models.Model):
    """A user's saved prompt (wildcards allowed), picked on the Generate drafts page."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="prompt_templates")
    name = models.CharField(max_length=100)
    text = models.TextField()
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="prompt_template_owner_name")]

    def __str__(self):
        return self.name
