"""``python -m distsched``: the ``distsched`` command, as ``python -m distsched.cli`` runs it."""

import runpy

# Runs distsched/cli/__main__.py as the main program, so both spellings stay one program.
runpy.run_module("distsched.cli", run_name="__main__")
