"""Side-by-side benchmarks (ratios measured in one run); their CLI is attnlab/commands/bench/."""
