"""`python -m plnt.reconciler.cli`: the `plnt` command."""

from plnt.reconciler.cli.main import main

main()
