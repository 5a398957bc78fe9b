"""The spec language: the resource models and the loader that reads YAML into them with FILE:LINE problems."""
