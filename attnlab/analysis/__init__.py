"""Analyses of trained models, one module per topic; each computes, writes its CSV, draws its figure.

- ``loss``: loss and perplexity over a whole split;
- ``per_position``: per-target loss of two runs and where one beats the other;
- ``names``: speaker names in generated text against the training cast;
- ``gates``, ``entropy``, ``hull``, ``attention``: statistics of captured attention (Figures 3-6);
- ``sink``: attention mass on the first token per layer and head (Qiu et al. 2025);
- ``retrieval``: the synthetic pattern-retrieval task;
- ``inputs``: what the attention analyses read (a run, validation windows) and ``write_csv``.

No argparse here: the ``attnlab analyze``, ``eval`` and ``retrieval`` commands live in
attnlab/commands/.
"""
