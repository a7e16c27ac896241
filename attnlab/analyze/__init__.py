"""`attnlab analyze <name>`: one module per analysis, each with ``register(subparsers)``."""
