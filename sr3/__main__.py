"""``python -m sr3`` runs the command line (the local cluster starts peers this way)."""

from sr3.cli import main

main()
