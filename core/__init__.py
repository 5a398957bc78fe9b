"""plnt core: the contracts every role uses (spec language, route table, status, telemetry, HTTP helpers, tokens)."""
