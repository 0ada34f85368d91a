import os
import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from queue_app.models import AccountSettings, Job, Project, Provider, Status


class Command(BaseCommand):
    help = "Create the demo account, a demo provider and a demo project with a few drafts (idempotent)."

    def handle(self, *args, **options):
        username = os.getenv("DEMO_USERNAME", "demo")
        password = os.getenv("DEMO_PASSWORD", "")
        User = get_user_model()
        with transaction.atomic():
            user = User.objects.filter(username=username).first()
            created = user is None
            if created:
                password = password or secrets.token_urlsafe(9)
                # An ordinary user: the demo sees its own queue on the monitor, nobody else's,
                # and has no admin (a demo password is printed on screens and in shells).
                user = User.objects.create_user(username=username, password=password)
            else:
                if password:
                    user.set_password(password)
                # An account made by an older version was a superuser: no longer.
                user.is_staff = user.is_superuser = False
                user.save(update_fields=["password", "is_staff", "is_superuser"])
            AccountSettings.objects.get_or_create(user=user)
            provider, _ = Provider.objects.get_or_create(
                owner=user,
                name="Demo",
                defaults=dict(family="demo", concurrency=2, options={"mode": "sync", "latency_ms": 1500}),
            )
            Provider.objects.get_or_create(
                owner=user,
                name="Demo async",
                defaults=dict(family="demo", concurrency=1, options={"mode": "async", "latency_ms": 4000}),
            )
            project, made = Project.objects.get_or_create(
                owner=user,
                name="Demo project",
                defaults=dict(kind="image", provider=provider, model="demo-image", aspect_ratio="1:1"),
            )
            if made:
                prompts = ["a lighthouse at dusk", "a cat astronaut", "a bowl of ramen, top view", "a foggy pine forest"]
                Job.objects.bulk_create(Job(project=project, owner=user, prompt=p, status=Status.DRAFT) for p in prompts)
        if created:
            self.stdout.write(self.style.SUCCESS(f"demo account: username {username!r}, password {password!r}"))
        elif password:
            self.stdout.write(f"demo account {username!r}: password set from DEMO_PASSWORD")
        else:
            self.stdout.write(f"demo account {username!r} exists (set DEMO_PASSWORD to reset its password)")
