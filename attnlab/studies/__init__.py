"""attnlab.studies."""

# the scales a study spec may define (here, not in spec.py: the CLI's --preset lists them at
# start-up, and spec.py's imports load numpy)
SCALES = ("ci", "cpu", "converged", "paper", "fair")
