"""The retrieval task's names and defaults, apart from the task (attnlab.analysis.retrieval) so
that `attnlab retrieval --help` lists them without loading torch."""

LOSSES = ("cos-ce", "cos-ce-weights", "cos", "mse")
PROTOCOLS = ("released", "attnlab")
METHODS = ("random", "bayes", "one-step", "converged-backprop", "converged-deq", "boosted")
UNTRAINED = ("random", "bayes")  # scored by formula: chance, and the Bayes-optimal classifier
# run_retrieval's defaults: the paper's Table 5 cell at its released budget
DEFAULTS = {"rounds": 2, "gate": "mlp", "queries": 5000, "steps": 150, "protocol": "released"}
