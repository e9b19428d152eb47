"""Tools built on the scheduler: the demo, the benchmark and a throwaway Redis.

Nothing below this wing imports it; the CLI loads a tool only inside the
command that runs it.
"""
