"""plnt reconciler: git source, specs, plan, saga, drivers, CLI."""
