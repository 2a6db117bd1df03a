"""``python -m deltastream`` runs the command line."""

from deltastream.cli import main

main()
