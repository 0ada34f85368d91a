"""The resolved snapshot a job is claimed with (ARCHITECTURE invariant 5).

The effective provider is the job's or else its project's; every output parameter is
the draft's or else the project's, resolved against what the model offers. Later
edits of the project cannot change a job in flight: the poller and the output writer
read this snapshot, never the project.
"""

from queue_app.engine import references
from queue_app.providers.base import ResolvedJob
from queue_app.providers.catalogue import default_model, model_spec, resolve_option


def build(job, project, provider) -> dict:
    family = provider.family if provider else ""
    kind = project.kind
    model = job.model or project.model or default_model(family, kind)
    spec = model_spec(family, model, provider.model_aliases if provider else None)

    def pick(name, allowed_attr):
        requested = getattr(job, name) or getattr(project, name)
        allowed = getattr(spec, allowed_attr) if spec else ()
        return resolve_option(requested, allowed)

    duration = job.duration or project.duration
    if spec and spec.durations and duration not in spec.durations:
        duration = min(spec.durations, key=lambda d: abs(d - (duration or 0)))
    return {
        "provider_id": provider.id if provider else None,
        "provider_name": provider.name if provider else "",
        "family": family,
        "kind": spec.kind if spec and kind != "comfyui" else kind,
        "model": model,
        # the catalogue model a provider's alias stood for when claimed (the job page shows it)
        "model_alias_of": ((provider.model_aliases or {}).get(model) or "") if provider else "",
        "aspect_ratio": pick("aspect_ratio", "aspect_ratios"),
        "quality": pick("quality", "qualities"),
        "resolution": pick("resolution", "resolutions"),
        "format": pick("format", "formats"),
        "background": pick("background", "backgrounds") if (job.background or project.background) else "",
        "duration": duration,
        "sound": job.sound or project.sound,
        "system_prompt": project.system_prompt,
        "temperature": project.temperature,
        "max_tokens": project.max_tokens,
        "params": dict(job.params or {}),
    }


def resolved_job(job, provider, *, submit: bool = False) -> ResolvedJob:
    """What the adapter gets: the snapshot plus the provider's credentials and options.
    `submit`: the references are sent, so uploaded and album images are read into data:
    URIs (a poll or a collect needs none of them, and does not read the files)."""
    snap = job.resolved or {}
    return ResolvedJob(
        job_id=str(job.id),
        provider_id=provider.id,
        family=provider.family,
        kind=snap.get("kind", "image"),
        model=snap.get("model", ""),
        prompt=job.prompt,
        references=references.for_provider(job.references, job.owner_id) if submit else list(job.references or []),
        aspect_ratio=snap.get("aspect_ratio") or "",
        quality=snap.get("quality") or "",
        resolution=snap.get("resolution") or "",
        format=snap.get("format") or "",
        background=snap.get("background") or "",
        duration=snap.get("duration"),
        sound=snap.get("sound") or "",
        system_prompt=snap.get("system_prompt") or "",
        temperature=snap.get("temperature"),
        max_tokens=snap.get("max_tokens"),
        params=snap.get("params") or {},
        options=dict(provider.options or {}),
        base_url=provider.base_url,
        api_key=provider.api_key,
        api_secret=provider.api_secret,
    )
