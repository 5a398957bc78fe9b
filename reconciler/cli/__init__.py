"""The `plnt` command line."""
