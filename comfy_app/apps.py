from django.apps import AppConfig


class ComfyAppConfig(AppConfig):
    name = "comfy_app"
    verbose_name = "ComfyUI"

    def ready(self):
        # comfy_app plugs into the queue through the runner registry; queue_app never
        # imports comfy_app.
        from comfy_app.runner import RUNNER
        from queue_app.engine import runner_registry
        from queue_app.models import Kind

        runner_registry.register(Kind.COMFYUI, RUNNER)

        from comfy_app import allowed_hosts

        allowed_hosts.register()
