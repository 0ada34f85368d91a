"""The longest prompt each model takes, in characters (../shared/providers/openai.md:
32,000 for GPT image models, 4,000 for dall-e-3, 1,000 for dall-e-2). A model not named
here takes what any draft may hold."""

DEFAULT_PROMPT_CHARS = 32_000

PROMPT_CHARS = {
    "dall-e-3": 4000,
    "dall-e-2": 1000,
}


def prompt_limit(model: str) -> int:
    return PROMPT_CHARS.get(model or "", DEFAULT_PROMPT_CHARS)
