"""Rollout gates: the checks a canary step must pass beyond its smoke test (a Gate resource each):
quality against golden expectations, live comparison with the stable release, a PromQL query, a
signed webhook."""
