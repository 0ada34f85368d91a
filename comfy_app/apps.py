from django.apps import AppConfig


class ComfyAppConfig(AppConfig):
    name = "comfy_app"
    verbose_name = "ComfyUI"
