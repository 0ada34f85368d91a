"""The options a provider record may carry, per family, declared once (their bounds in
queue_app/limits.py): the provider page
builds its form fields from this, the API and the page validate through `clean_options`.
An option left blank is removed (the adapter's default applies).

Keys not declared here (e.g. RunningHub's `node_info_list`, `layered_models`) are expert
settings kept as they are by the page and editable in the admin as JSON."""

from dataclasses import dataclass

from queue_app import limits
from queue_app.providers import prices


@dataclass(frozen=True)
class Option:
    name: str
    label: str
    type: type  # str, int, float or bool
    help: str = ""
    low: float | None = None
    high: float | None = None
    choices: tuple = ()


OPTIONS: dict[str, tuple[Option, ...]] = {
    "demo": (
        Option("mode", "Mode", str, "sync finishes in the call; async returns a task that is polled", choices=("sync", "async")),
        Option(
            "latency_ms",
            "Latency (ms)",
            int,
            "how long one generation takes",
            limits.DEMO_LATENCY_MS.low,
            limits.DEMO_LATENCY_MS.high,
        ),
        Option(
            "fail_rate",
            "Failure rate",
            float,
            "share of calls that fail, 0 to 1",
            limits.DEMO_FAIL_RATE.low,
            limits.DEMO_FAIL_RATE.high,
        ),
        Option(
            "fail_kind",
            "Failure kind",
            str,
            "how a simulated failure fails",
            choices=("transient", "permanent", "ambiguous", "account", "rate_limit"),
        ),
        Option(
            "retry_after",
            "Retry after (s)",
            float,
            "the wait a simulated 429 asks for",
            limits.DEMO_RETRY_AFTER.low,
            limits.DEMO_RETRY_AFTER.high,
        ),
        Option("layers", "Layers", int, "layers the demo-layers model returns", limits.DEMO_LAYERS.low, limits.DEMO_LAYERS.high),
    ),
    "openai": (
        Option("organization", "Organization id", str, "sent as OpenAI-Organization"),
        Option("project", "Project id", str, "sent as OpenAI-Project"),
        Option("response_format", "Response format", str, "for DALL·E models", choices=("b64_json", "url")),
    ),
    "replicate": (Option("wait_seconds", "Wait (s)", int, "hold the create call open up to this long", 0, 60),),
    "civitai": (
        Option("wait_seconds", "Wait (s)", int, "hold the create call open up to this long", 0, 90),
        Option("allow_mature_content", "Allow mature content", bool),
    ),
    "runninghub": (
        Option("workflow_id", "Workflow id", str, "default workflow for ComfyUI-graph models"),
        Option("webapp_id", "AI app id", str, "default web app for the ai-app model"),
        Option("prompt_node", "Prompt node", str, "node id that takes the prompt"),
    ),
    "google": (),
}


# Every family: what an ambiguous submission does (engine/ambiguous.py; blank: hold for
# video, retry otherwise).
ON_AMBIGUOUS = Option(
    "on_ambiguous",
    "On an unclear submission",
    str,
    "a lost answer to a submit: retry (may pay twice) or hold the job for attention",
    choices=("retry", "hold"),
)

# Every family: the status checks a minute the poller may send (providers/budget.py; blank:
# the family's documented limit).
STATUS_PER_MINUTE = Option(
    "status_per_minute",
    "Status checks per minute",
    int,
    "the poller's budget of status requests; blank: the provider's documented limit",
    limits.STATUS_PER_MINUTE.low,
    limits.STATUS_PER_MINUTE.high,
)


# Every family: what the record pays (providers/prices.py, docs/money.md; blank: the
# defaults, in the family's currency).
CURRENCY = Option(
    "currency",
    "Currency",
    str,
    "what this account is billed in; blank: the family's (USD, Buzz for Civitai, coins for RunningHub)",
    choices=prices.CURRENCIES,
)
PRICES = Option(
    "prices",
    "Prices",
    str,
    "model=price; … in the model's unit (per image, per second of video, in/out per 1M tokens, "
    "0.001/s@20 per second of hardware); * for every other model; blank: the defaults",
)


# Every family: budgets in the record's currency (engine/budgets.py; blank: none).
BUDGET_DAY = Option("budget_day", "Budget a day", float, "dispatch stops before a day's spend crosses it (UTC days)", 0, 1e9)
BUDGET_MONTH = Option("budget_month", "Budget a month", float, "dispatch stops before a month's spend crosses it", 0, 1e9)


def declared(family: str) -> tuple[Option, ...]:
    return (*OPTIONS.get(family, ()), ON_AMBIGUOUS, STATUS_PER_MINUTE, CURRENCY, PRICES, BUDGET_DAY, BUDGET_MONTH)


def clean_option(option: Option, value):
    """One option's value, typed and within bounds, or None (blank: not set). Accepts
    JSON values and form strings alike; raises ValueError with a readable message."""
    if value is None or value == "":
        return None
    if option is PRICES:
        return prices.clean_prices(value) or None
    if option.type is bool:
        if isinstance(value, bool):
            return value
        if value in ("on", "true", "1"):
            return True
        if value in ("off", "false", "0"):
            return False
        raise ValueError(f"{option.label} must be true or false")
    if option.type is str:
        if not isinstance(value, str) or len(value) > 200:
            raise ValueError(f"{option.label} must be text of at most 200 characters")
        value = value.strip()
        if option.choices and value not in option.choices:
            raise ValueError(f"{option.label} must be one of {', '.join(option.choices)}")
        return value or None
    try:
        if isinstance(value, bool):
            raise ValueError
        number = option.type(value) if isinstance(value, str) else value
        if option.type is int and (not isinstance(number, int) or isinstance(number, bool)):
            raise ValueError
        if not isinstance(number, int | float) or number != number:  # NaN
            raise ValueError
    except (TypeError, ValueError):
        kind = "a whole number" if option.type is int else "a number"
        raise ValueError(f"{option.label} must be {kind} from {option.low:g} to {option.high:g}") from None
    if not option.low <= number <= option.high:
        kind = "a whole number" if option.type is int else "a number"
        raise ValueError(f"{option.label} must be {kind} from {option.low:g} to {option.high:g}")
    return number


def clean_options(family: str, values: dict, *, keep: dict | None = None) -> dict:
    """Declared options of `family` from `values` over `keep` (the stored options: what
    `values` does not mention stays). Unknown keys in `values` are refused."""
    if not isinstance(values, dict):
        raise ValueError("options must be an object")
    known = {option.name: option for option in declared(family)}
    unknown = set(values) - set(known)
    if unknown:
        allowed = ", ".join(known) or "none"
        raise ValueError(f"unknown option(s) for {family}: {', '.join(sorted(unknown))} (allowed: {allowed})")
    result = dict(keep or {})
    for name, value in values.items():
        cleaned = clean_option(known[name], value)
        if cleaned is None:
            result.pop(name, None)
        else:
            result[name] = cleaned
    return result
