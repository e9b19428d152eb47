"""The operations of a namespace, as pure generators (no I/O), floor by floor."""
