"""Pull and verify what a spec names: registries, archives, trust policies, model weights."""
