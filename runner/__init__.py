"""plnt runner: serves one microagents recipe."""
