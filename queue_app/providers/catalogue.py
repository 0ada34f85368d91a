"""The model catalogue and option resolution.

Each family lists its models with the values they accept (from ../shared/providers/).
`resolve_option` maps a requested value onto what a model offers, so a draft written for
one model still runs on another: `1024x1024` drafted for OpenAI and run on a RunningHub
model that takes ratios becomes `1:1`.
"""

import math
import re
from dataclasses import dataclass, field

GEMINI_RATIOS = ("1:1", "2:3", "3:2", "3:4", "4:3", "4:5", "5:4", "9:16", "16:9", "21:9")
RH_RATIOS = ("1:1", "16:9", "9:16", "4:3", "3:4", "3:2", "2:3", "5:4", "4:5", "21:9", "1:4", "4:1", "1:8", "8:1")
FLUX_RATIOS = ("1:1", "16:9", "9:16", "3:2", "2:3", "4:3", "3:4", "match_input_image")
DEMO_RATIOS = ("1:1", "4:3", "3:4", "16:9", "9:16", "3:2", "2:3")


@dataclass(frozen=True)
class ModelSpec:
    id: str
    name: str
    kind: str  # image | video | text | audio
    aspect_ratios: tuple = ()
    qualities: tuple = ()
    resolutions: tuple = ()
    durations: tuple = ()
    backgrounds: tuple = ()
    formats: tuple = ()
    extra: dict = field(default_factory=dict)


def _models(*specs: ModelSpec) -> dict:
    return {spec.id: spec for spec in specs}


CATALOGUE: dict[str, dict[str, ModelSpec]] = {
    "demo": _models(
        ModelSpec("demo-image", "Demo image", "image", DEMO_RATIOS, ("low", "high"), formats=("png",)),
        ModelSpec("demo-text", "Demo text", "text"),
        ModelSpec("demo-audio", "Demo audio", "audio", formats=("wav",)),
        ModelSpec("demo-layers", "Demo layered image", "image", DEMO_RATIOS, extra={"layers": True}),
    ),
    "openai": _models(
        ModelSpec(
            "gpt-image-1.5",
            "GPT Image 1.5",
            "image",
            ("1024x1024", "1536x1024", "1024x1536", "auto"),
            ("low", "medium", "high", "auto"),
            backgrounds=("transparent", "opaque", "auto"),
            formats=("png", "jpeg", "webp"),
        ),
        ModelSpec(
            "gpt-image-1",
            "GPT Image 1",
            "image",
            ("1024x1024", "1536x1024", "1024x1536", "auto"),
            ("low", "medium", "high", "auto"),
            backgrounds=("transparent", "opaque", "auto"),
            formats=("png", "jpeg", "webp"),
        ),
        ModelSpec(
            "gpt-image-2",
            "GPT Image 2",
            "image",
            ("1024x1024", "1536x1024", "1024x1536", "2048x2048", "2048x1152", "1152x2048", "3840x2160", "2160x3840", "auto"),
            ("low", "medium", "high", "auto"),
            backgrounds=("auto", "opaque"),
            formats=("png", "jpeg", "webp"),
        ),
        ModelSpec("dall-e-3", "DALL·E 3", "image", ("1024x1024", "1792x1024", "1024x1792"), ("standard", "hd")),
        ModelSpec("gpt-4.1-mini", "GPT-4.1 mini", "text"),
        ModelSpec("gpt-4o", "GPT-4o", "text"),
        ModelSpec("sora-2", "Sora 2", "video", ("1280x720", "720x1280"), durations=(4, 8, 12)),
    ),
    "google": _models(
        # imageConfig.imageSize (uppercase K) is a resolution, not a quality.
        ModelSpec(
            "gemini-3.1-flash-image-preview",
            "Nano Banana 2",
            "image",
            GEMINI_RATIOS + ("1:4", "4:1", "1:8", "8:1", "9:21"),
            resolutions=("1K", "2K", "4K"),
        ),
        ModelSpec(
            "gemini-3-pro-image-preview",
            "Nano Banana Pro",
            "image",
            GEMINI_RATIOS + ("1:4", "4:1"),
            resolutions=("1K", "2K", "4K"),
        ),
        ModelSpec("gemini-2.5-flash-image", "Nano Banana", "image", GEMINI_RATIOS, resolutions=("1K",)),
        ModelSpec("gemini-2.5-flash", "Gemini 2.5 Flash", "text"),
        ModelSpec("gemini-2.5-pro", "Gemini 2.5 Pro", "text"),
        ModelSpec(
            "veo-3.1-generate-preview",
            "Veo 3.1",
            "video",
            ("16:9", "9:16"),
            resolutions=("720p", "1080p", "4k"),
            durations=(4, 6, 8),
        ),
    ),
    "runninghub": _models(
        ModelSpec(
            "rhart-image-n-pro/text-to-image",
            "Nano Banana Pro (RunningHub)",
            "image",
            RH_RATIOS,
            resolutions=("1k", "2k", "4k"),
            extra={"with_references": "rhart-image-n-pro/edit"},
        ),
        ModelSpec(
            "rhart-image-g-2-official/text-to-image",
            "GPT Image 2 (RunningHub)",
            "image",
            RH_RATIOS,
            ("low", "medium", "high"),
            resolutions=("1k", "2k", "4k"),
        ),
        ModelSpec("workflow", "ComfyUI workflow (RunningHub)", "image", extra={"workflow": True}),
        # A user's Qwen-Image-Layered workflow: results[0] is the composite, the rest layers.
        ModelSpec(
            "workflow-layers", "Layer decomposition workflow (RunningHub)", "image", extra={"workflow": True, "layers": True}
        ),
        ModelSpec("ai-app", "AI app (RunningHub)", "image", extra={"workflow": True}),
        ModelSpec("workflow-video", "ComfyUI video workflow (RunningHub)", "video", extra={"workflow": True}),
        ModelSpec(
            "bytedance/seedance-2.0-global/text-to-video",
            "Seedance 2.0 (RunningHub)",
            "video",
            ("adaptive", "16:9", "4:3", "1:1", "3:4", "9:16", "21:9"),
            resolutions=("480p", "720p", "1080p"),
            durations=tuple(range(4, 16)),
            extra={"with_references": "bytedance/seedance-2.0-global/image-to-video"},
        ),
    ),
    "civitai": _models(
        # v2 `imageGen` steps: engine `sdcpp` with the AIR's ecosystem (recipes/sdxl.md).
        ModelSpec(
            "urn:air:sdxl:checkpoint:civitai:101055@128078",
            "SDXL (Juggernaut XL)",
            "image",
            ("1:1", "3:2", "2:3", "16:9", "9:16"),
            extra={"engine": "sdcpp", "ecosystem": "sdxl"},
        ),
        ModelSpec(
            "urn:air:flux1:checkpoint:civitai:618692@691639",
            "Flux.1 dev",
            "image",
            ("1:1", "3:2", "2:3", "16:9", "9:16"),
            extra={"engine": "sdcpp", "ecosystem": "flux1"},
        ),
    ),
    "replicate": _models(
        ModelSpec(
            "black-forest-labs/flux-2-pro",
            "FLUX.2 pro",
            "image",
            FLUX_RATIOS,
            resolutions=("1 MP", "0.25 MP", "0.5 MP", "2 MP", "4 MP"),
            extra={"reference_field": "input_images"},
        ),
        ModelSpec("black-forest-labs/flux-schnell", "FLUX schnell", "image", FLUX_RATIOS),
        ModelSpec(
            "bytedance/seedance-1-pro",
            "Seedance 1 pro",
            "video",
            ("16:9", "9:16", "1:1"),
            resolutions=("480p", "720p", "1080p"),
            durations=(5, 10),
            extra={"reference_field": "image"},
        ),
    ),
}


def model_spec(family: str, model: str, aliases: dict | None = None) -> ModelSpec | None:
    """The catalogue entry for a model id, following a provider's custom alias to its base.

    An alias whose base is unknown (or a model id the catalogue does not list) has no spec:
    its values pass through unchanged.
    """
    models = CATALOGUE.get(family, {})
    if model in models:
        return models[model]
    base = (aliases or {}).get(model)
    return models.get(base) if base else None


def default_model(family: str, kind: str) -> str:
    for spec in CATALOGUE.get(family, {}).values():
        if spec.kind == kind:
            return spec.id
    return ""


_SHAPE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*[:x*×]\s*(\d+(?:\.\d+)?)\s*$", re.IGNORECASE)


def parse_shape(value: str) -> float | None:
    """`16:9`, `1536x1024`, `1536*1024` → width/height; anything else → None."""
    match = _SHAPE.match(value or "")
    if not match:
        return None
    width, height = float(match.group(1)), float(match.group(2))
    if width <= 0 or height <= 0:
        return None
    return width / height


def resolve_option(value, allowed) -> str:
    """Map a requested value onto the values a model offers.

    - no list (a custom model) → the value unchanged;
    - an offered value (also case-insensitively) → that value;
    - a shape (`w:h` or `WxH`) → the offered shape closest in log aspect ratio;
    - empty, unparseable or no offered shape → the first offered value.
    """
    if not allowed:
        return value
    allowed = [str(option) for option in allowed]
    value = "" if value is None else str(value)
    if not value:
        return allowed[0]
    if value in allowed:
        return value
    folded = value.casefold()
    for option in allowed:
        if option.casefold() == folded:
            return option
    target = parse_shape(value)
    if target is None:
        return allowed[0]
    best, best_distance = None, math.inf
    for option in allowed:
        ratio = parse_shape(option)
        if ratio is None:
            continue
        distance = abs(math.log(ratio / target))
        if distance < best_distance:
            best, best_distance = option, distance
    return best if best is not None else allowed[0]
