"""Option resolution: a value the model offers stays; another becomes the closest shape."""

import pytest

from queue_app.providers.catalogue import CATALOGUE, model_spec, parse_shape, resolve_option

RATIOS = ["1:1", "16:9", "9:16", "4:3", "3:4", "3:2", "2:3"]
OPENAI_SIZES = ["1024x1024", "1536x1024", "1024x1536", "auto"]


@pytest.mark.parametrize(
    "value, allowed, expected",
    [
        ("16:9", RATIOS, "16:9"),  # offered: stays
        ("1024x1024", RATIOS, "1:1"),  # OpenAI pixels drafted, ratio model runs it
        ("1536x1024", RATIOS, "3:2"),
        ("1024x1536", RATIOS, "2:3"),
        ("1920x1080", RATIOS, "16:9"),
        ("21:9", RATIOS, "16:9"),  # widest offered
        ("16:9", OPENAI_SIZES, "1536x1024"),  # log distance to 1.5 beats 1.0
        ("9:16", OPENAI_SIZES, "1024x1536"),
        ("1:1", OPENAI_SIZES, "1024x1024"),
        ("1536*1024", RATIOS, "3:2"),
        ("1536 × 1024", RATIOS, "3:2"),
        ("AUTO", OPENAI_SIZES, "auto"),  # case-insensitive match
        ("auto", RATIOS, "1:1"),  # unparseable and not offered: first offered
        ("match_input_image", RATIOS, "1:1"),
        ("banana", RATIOS, "1:1"),
        ("0:9", RATIOS, "1:1"),  # degenerate shape: unparseable
        ("", RATIOS, "1:1"),
        (None, RATIOS, "1:1"),
        ("7:3", ["auto", "adaptive"], "auto"),  # no shapes offered at all
        ("1024x1024", [], "1024x1024"),  # custom model without a list: unchanged
        ("1024x1024", None, "1024x1024"),
        ("hd", ["standard", "HD"], "HD"),
        ("ultra", ["low", "medium", "high"], "low"),
    ],
)
def test_resolve_option_table(value, allowed, expected):
    assert resolve_option(value, allowed) == expected


@pytest.mark.parametrize("value, ratio", [("3:2", 1.5), ("1024x512", 2.0), ("1.5:1", 1.5), ("x", None), ("10:0", None)])
def test_parse_shape(value, ratio):
    assert parse_shape(value) == ratio


def test_every_catalogue_model_offers_valid_defaults():
    for family, models in CATALOGUE.items():
        for model_id, spec in models.items():
            assert spec.id == model_id, family
            assert spec.kind in ("image", "video", "text", "audio")
            for ratio in spec.aspect_ratios:
                assert parse_shape(ratio) is not None or ratio in ("auto", "adaptive", "match_input_image")


def test_a_custom_alias_inherits_its_base_models_options():
    spec = model_spec("google", "my-banana", {"my-banana": "gemini-2.5-flash-image"})
    assert spec is not None and "16:9" in spec.aspect_ratios
    assert model_spec("google", "my-unknown", {"my-unknown": "not-in-catalogue"}) is None
