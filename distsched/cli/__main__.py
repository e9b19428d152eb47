"""``python -m distsched.cli``: the ``distsched`` command."""

from distsched.cli import main

main()
