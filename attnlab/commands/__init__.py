"""CLI sub-commands, one module each; see attnlab.cli."""
