"""``python -m syncmgr ...`` runs the daemon binary, as the ``syncmgr`` command does."""

from ._cli import main

main()
