"""Settings in sections, and the flat names tests and benches still use (FLAT_NAMES)."""

from __future__ import annotations

import pytest
from plnt.reconciler.settings import FLAT_NAMES, Settings, SourceSettings, TemporalSettings
from pydantic import BaseModel, SecretStr, ValidationError


def test_each_flat_name_lands_on_its_section_field() -> None:
    for flat, where in FLAT_NAMES.items():
        section, field = where.split(".")
        model = Settings.model_fields[section].annotation
        assert isinstance(model, type) and issubclass(model, BaseModel) and field in model.model_fields, flat
    assert len(set(FLAT_NAMES.values())) == len(FLAT_NAMES)


def test_flat_names_and_sections_build_the_same_settings() -> None:
    flat = Settings(repo="r", interval_s=2, temporal_address="t:7233", max_concurrent_sagas=3, port=0)
    sectioned = Settings(source=SourceSettings(repo="r", interval_s=2), port=0,
                         temporal=TemporalSettings(address="t:7233", max_concurrent_sagas=3))
    assert flat == sectioned
    # A flat name joins what its section was given, as a model or a dict.
    assert Settings(source={"repo": "r"}, interval_s=2) == Settings(source=SourceSettings(repo="r"), interval_s=2)
    assert flat.source.interval_s == 2 and flat.temporal.address == "t:7233" and flat.temporal.namespace == "default"


def test_an_unknown_flat_name_is_still_an_error() -> None:
    with pytest.raises(ValidationError, match="temporal_adress\n  Extra inputs are not permitted"):
        Settings(repo="r", temporal_adress="t:7233")  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        Settings(source={"repo": "r", "temporal_address": "t:7233"})


def test_the_validators_that_relate_sections_keep_their_messages() -> None:
    with pytest.raises(ValidationError, match="TLS and API key options are for an external Temporal"):
        Settings(repo="r", temporal_tls=True)
    with pytest.raises(ValidationError, match="--previews needs a forge"):
        Settings(repo="r", previews=("refs/pull/*/head",))
    assert Settings(repo="r", previews=("refs/pull/*/head",), control_url="http://c").review.previews  # a worker


def test_the_repr_shows_no_secret() -> None:
    secrets = dict(forge_token="forge-S3KR1T", temporal_api_key="temporal-S3KR1T", llm_api_key="llm-S3KR1T",
                   internal_token="internal-S3KR1T", gateway_tokens=("gateway-S3KR1T",))
    settings = Settings(repo="https://user:repo-S3KR1T@forge.example/specs.git", forge="github", forge_api_url="u",
                        forge_project="o/r", temporal_address="t:7233",
                        **{name: SecretStr(v) if isinstance(v, str) else v for name, v in secrets.items()})
    shown = repr(settings)
    assert "S3KR1T" not in shown and "S3KR1T" not in str(settings), shown
