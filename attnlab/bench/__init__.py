"""`attnlab bench <name>`: one module per benchmark, each with ``register(subparsers)``."""
