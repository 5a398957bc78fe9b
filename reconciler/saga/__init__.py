"""The durable canary saga on Temporal: workflow, activities, smoke test, progress, history."""
