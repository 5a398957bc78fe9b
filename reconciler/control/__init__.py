"""The control plane's loop and what it publishes: status, metrics, Kubernetes mirror, lease."""
