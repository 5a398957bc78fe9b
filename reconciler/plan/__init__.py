"""The decision: a pure diff of desired against live state, its digest, and how it is shown."""
