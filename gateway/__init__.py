"""plnt gateway: routes invocations to promoted runners (and canaries)."""
