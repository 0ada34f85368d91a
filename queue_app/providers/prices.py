"""What a job costs: the default price per model, in the unit its provider bills, and a
provider record's own prices and currency (docs/money.md).

Units: `image` (per output image), `video_second` (per second of output video), `tokens`
(per 1M input and 1M output tokens), `task` (per job, e.g. Buzz or RunningHub coins) and
`hardware_second` (Replicate: per second of predict time, with the seconds a run is
expected to take). A tiered price names the resolved settings its tier is keyed on.

A default is a starting point with its date and page; a record whose account pays other
prices overrides them (option `prices`) and may name its currency (option `currency`).
There are no exchange rates: a record in another currency than a default's has no default
price. An unknown price is `None`, never 0.
"""

import math
import re
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

CURRENCIES = ("USD", "EUR", "GBP", "CNY", "Buzz", "coins")
UNITS = ("image", "video_second", "tokens", "task", "hardware_second")
# A text job's output is unknown before it runs: the estimate assumes this many tokens
# unless the project sets max_tokens (the most it can cost).
DEFAULT_OUTPUT_TOKENS = 1000
CHARS_PER_TOKEN = 4
FAMILY_CURRENCY = {"civitai": "Buzz", "runninghub": "coins"}
MAX_AMOUNT = Decimal("100000")


@dataclass(frozen=True)
class Price:
    unit: str
    amounts: dict  # tier key ("" when flat; "input"/"output" for tokens) -> Decimal
    tier: tuple = ()  # resolved settings whose values, joined by "|", are the tier key
    as_of: str = ""
    source: str = ""
    currency: str = "USD"
    seconds: Decimal | None = None  # hardware_second: the run time an estimate assumes


@dataclass(frozen=True)
class Cost:
    amount: Decimal | None  # None: unknown
    currency: str
    unit: str = ""
    basis: str = ""  # how it was reached, for people: "default 2026-…", "record's price"
    detail: dict = field(default_factory=dict)


def _d(value) -> Decimal:
    return Decimal(str(value))


def _flat(unit, amount, **kw) -> Price:
    return Price(unit, {"": _d(amount)}, **kw)


def _tiers(unit, tier, table: dict, **kw) -> Price:
    return Price(unit, {key: _d(amount) for key, amount in table.items()}, tier=tier, **kw)


OPENAI = "https://openai.com/api/pricing/"
GEMINI = "https://ai.google.dev/gemini-api/docs/pricing"
REPLICATE = "https://replicate.com/pricing"


def _gpt_image(low, low_big, medium, medium_big, high, high_big, *, as_of, source=OPENAI) -> Price:
    # "auto" lets the model choose: estimated at the highest quality, the most it can cost
    table = {"low|square": low, "low|other": low_big, "medium|square": medium, "medium|other": medium_big}
    table |= {"high|square": high, "high|other": high_big, "auto|square": high, "auto|other": high_big}
    return _tiers("image", ("quality", "shape"), table, as_of=as_of, source=source)


DEFAULTS: dict[str, dict[str, Price]] = {
    "demo": {
        model: _flat("image" if model != "demo-text" else "task", 0, as_of="2026-12-02", source="built in, free")
        for model in ("demo-image", "demo-text", "demo-audio", "demo-layers")
    },
    "openai": {
        "gpt-image-1": _gpt_image(0.011, 0.016, 0.042, 0.063, 0.167, 0.25, as_of="2026-12-02"),
        "gpt-image-1.5": _gpt_image(0.009, 0.013, 0.034, 0.05, 0.133, 0.2, as_of="2026-12-02"),
        # token-priced; per-image figures as published for it by fal.ai (approximate)
        "gpt-image-2": _gpt_image(
            0.02, 0.03, 0.07, 0.1, 0.19, 0.28, as_of="2026-05-01", source="https://fal.ai/models/openai/gpt-image-2"
        ),
        "dall-e-3": _tiers(
            "image",
            ("quality", "shape"),
            {"standard|square": 0.04, "standard|other": 0.08, "hd|square": 0.08, "hd|other": 0.12},
            as_of="2023-12-25",
            source=OPENAI,
        ),
        "gpt-4.1-mini": _tiers("tokens", (), {"input": 0.40, "output": 1.60}, as_of="2026-12-02", source=OPENAI),
        "gpt-4o": _tiers("tokens", (), {"input": 2.50, "output": 10.00}, as_of="2026-12-02", source=OPENAI),
        "sora-2": _flat("video_second", 0.10, as_of="2026-12-02", source=OPENAI),
    },
    "google": {
        "gemini-2.5-flash-image": _flat("image", 0.039, as_of="2026-12-02", source=GEMINI),
        "gemini-3-pro-image-preview": _tiers(
            "image", ("resolution",), {"1K": 0.134, "2K": 0.134, "4K": 0.24}, as_of="2026-12-02", source=GEMINI
        ),
        "gemini-3.1-flash-image-preview": _tiers(
            "image", ("resolution",), {"1K": 0.067, "2K": 0.101, "4K": 0.151}, as_of="2026-12-02", source=GEMINI
        ),
        "gemini-2.5-flash": _tiers("tokens", (), {"input": 0.30, "output": 2.50}, as_of="2026-12-02", source=GEMINI),
        "gemini-2.5-pro": _tiers("tokens", (), {"input": 1.25, "output": 10.00}, as_of="2026-12-02", source=GEMINI),
        "veo-3.1-generate-preview": _tiers(
            "video_second", ("resolution",), {"720p": 0.40, "1080p": 0.40, "4k": 0.60}, as_of="2026-12-02", source=GEMINI
        ),
    },
    "replicate": {
        "black-forest-labs/flux-schnell": _flat("image", 0.003, as_of="2026-10-07", source=REPLICATE),
        # priced per output megapixel ("from $0.03" at 1 MP)
        "black-forest-labs/flux-2-pro": _tiers(
            "image",
            ("resolution",),
            {"0.25 MP": 0.03, "0.5 MP": 0.03, "1 MP": 0.03, "2 MP": 0.06, "4 MP": 0.12},
            as_of="2026-11-16",
            source="https://docs.bfl.ai/quick_start/pricing",
        ),
        "bytedance/seedance-1-pro": _tiers(
            "video_second",
            ("resolution",),
            {"480p": 0.03, "720p": 0.06, "1080p": 0.15},
            as_of="2026-12-02",
            source="https://replicate.com/bytedance/seedance-1-pro",
        ),
    },
    # Civitai (Buzz) and RunningHub (coins) publish no per-model table for the API: their
    # prices are unknown until a record sets them; settlement reads the charged figure
    # from the response (Civitai `cost`, RunningHub `consumeCoins`).
    "civitai": {},
    "runninghub": {},
}


def shape_class(aspect_ratio: str) -> str:
    """`square` for 1:1 sizes (and a blank or `auto`), else `other` (OpenAI's two price rows)."""
    value = (aspect_ratio or "").strip().lower()
    if value in ("", "auto", "1:1"):
        return "square"
    match = re.match(r"^(\d+)\s*[x:*]\s*(\d+)$", value)
    return "square" if match and match.group(1) == match.group(2) else "other"


def record_currency(family: str, options: dict | None) -> str:
    return (options or {}).get("currency") or FAMILY_CURRENCY.get(family, "USD")


def price_for(family: str, model: str, options: dict | None = None, *, base_model: str = "") -> Price | None:
    """The price a record of `family` pays for `model`: the record's own (option `prices`,
    by model id, else its `*` entry), else the default for the model (or the catalogue model
    an alias stands for) when it is in the record's currency. None: unknown."""
    currency = record_currency(family, options)
    defaults = DEFAULTS.get(family, {})
    default = defaults.get(model) or defaults.get(base_model)
    own = ((options or {}).get("prices") or {}).get(model) or ((options or {}).get("prices") or {}).get("*")
    if own is not None:
        return _override(own, default, currency)
    if default is not None and default.currency == currency:
        return default
    return None


def _override(text: str, default: Price | None, currency: str) -> Price:
    parsed = parse_amount(text)
    source = "the provider record"
    if parsed["unit"] == "hardware_second":
        return Price("hardware_second", {"": parsed["amount"]}, seconds=parsed.get("seconds"), source=source, currency=currency)
    if parsed["unit"] == "tokens":
        return Price("tokens", {"input": parsed["input"], "output": parsed["output"]}, source=source, currency=currency)
    unit = default.unit if default is not None and default.unit in ("image", "video_second", "task") else "task"
    return Price(unit, {"": parsed["amount"]}, source=source, currency=currency)


def job_cost(price: Price | None, settings: dict, *, prompt: str = "", currency: str = "USD") -> Cost:
    """The estimate of one job run with `settings` (the resolved snapshot's keys)."""
    if price is None:
        return Cost(None, currency)
    basis = f"{price.source} ({price.as_of})" if price.as_of else price.source
    if price.unit == "tokens":
        words = len(prompt or "") + len(settings.get("system_prompt") or "")
        tokens_in = math.ceil(words / CHARS_PER_TOKEN)
        tokens_out = settings.get("max_tokens") or DEFAULT_OUTPUT_TOKENS
        amount = (tokens_in * price.amounts["input"] + tokens_out * price.amounts["output"]) / 1_000_000
        detail = {"input_tokens": tokens_in, "output_tokens": tokens_out}
        return Cost(_round(amount), price.currency, price.unit, basis, detail)
    per = _tier_amount(price, settings)
    if per is None:
        return Cost(None, price.currency, price.unit, basis)
    if price.unit == "video_second":
        seconds = settings.get("duration")
        amount = per * seconds if seconds else None
    elif price.unit == "hardware_second":
        amount = per * price.seconds if price.seconds else None
    else:
        amount = per
    return Cost(None if amount is None else _round(amount), price.currency, price.unit, basis)


def reported_cost(price: Price | None, usage: dict, currency: str) -> Decimal | None:
    """What a finished job cost by the provider's own report (Finished.usage): the charged
    figure when it is in the record's currency, else the usage priced in the price's unit
    (tokens, seconds of hardware). None: nothing reported that prices it."""
    try:
        if usage.get("charged") is not None and usage.get("currency") == currency:
            return _round(_d(usage["charged"]))
        if price is not None and price.unit == "tokens" and "input_tokens" in usage and "output_tokens" in usage:
            tokens_in, tokens_out = _d(usage["input_tokens"]), _d(usage["output_tokens"])
            return _round((tokens_in * price.amounts["input"] + tokens_out * price.amounts["output"]) / 1_000_000)
        if price is not None and price.unit == "hardware_second" and usage.get("predict_time") is not None:
            return _round(price.amounts[""] * _d(usage["predict_time"]))
    except (InvalidOperation, ValueError, TypeError, KeyError):
        return None  # an odd report is no reason to fail a finished job: the estimate stands
    return None


def _tier_amount(price: Price, settings: dict) -> Decimal | None:
    if not price.tier:
        return price.amounts.get("")
    values = [
        shape_class(settings.get("aspect_ratio") or "") if name == "shape" else str(settings.get(name) or "")
        for name in price.tier
    ]
    return price.amounts.get("|".join(values))


def _round(amount: Decimal) -> Decimal:
    return amount.quantize(Decimal("0.000001"), rounding=ROUND_HALF_UP)


_ENTRY = re.compile(r"^\s*([^=]+?)\s*=\s*(.+?)\s*$")


def parse_amount(text) -> dict:
    """One price as a record writes it: `0.05` (the model's unit), `2.5/10` (per 1M input /
    output tokens), `0.000975/s@20` (per second of hardware, 20 s a run). ValueError with a
    readable message otherwise."""
    text = str(text).strip()
    if "/s" in text:
        amount, _, seconds = text.partition("/s")
        seconds = seconds.lstrip("@").strip()
        return {"unit": "hardware_second", "amount": _amount(amount), "seconds": _amount(seconds) if seconds else None}
    if "/" in text:
        tokens_in, _, tokens_out = text.partition("/")
        return {"unit": "tokens", "input": _amount(tokens_in), "output": _amount(tokens_out)}
    return {"unit": "", "amount": _amount(text)}


def _amount(text: str) -> Decimal:
    try:
        value = Decimal(text.strip())
    except (InvalidOperation, ValueError):
        raise ValueError(f"{text.strip()!r} is not a price: write a number such as 0.04") from None
    if not value.is_finite() or value < 0:
        raise ValueError(f"{text.strip()!r} is not a price: it must be 0 or more")
    if value > MAX_AMOUNT:
        raise ValueError(f"{text.strip()!r} is not a price: at most {MAX_AMOUNT}")
    return value


def clean_prices(value) -> dict:
    """Option `prices`: `model=price` entries (one a line, or separated by `;`), or an object
    {model: price}; `*` stands for every model the record has no entry for. Returns
    {model: price text}, each price checked by parse_amount."""
    if isinstance(value, dict):
        pairs = [(str(key).strip(), str(amount)) for key, amount in value.items()]
    elif isinstance(value, str):
        pairs = []
        for entry in re.split(r"[;\n]", value):
            if not entry.strip():
                continue
            match = _ENTRY.match(entry)
            if not match:
                raise ValueError(f"{entry.strip()!r}: write model=price, e.g. gpt-image-1=0.05")
            pairs.append((match.group(1), match.group(2)))
    else:
        raise ValueError("prices must be text (model=price; …) or an object")
    cleaned = {}
    for model, amount in pairs:
        if not model:
            raise ValueError("a price needs a model id (or * for every model)")
        try:
            parse_amount(amount)
        except ValueError as error:
            raise ValueError(f"price of {model}: {error}") from None
        cleaned[model] = amount.strip()
    return cleaned


def prices_text(value) -> str:
    """Option `prices` as the form shows it."""
    if isinstance(value, dict):
        return "; ".join(f"{model}={amount}" for model, amount in value.items())
    return value or ""
