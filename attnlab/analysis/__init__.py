"""Analyses of trained models, one module per topic; each computes, writes its CSV, draws its figure.

- ``loss``: loss and perplexity over a whole split;
- ``per_position``: per-target loss of two runs and where one beats the other;
- ``names``: speaker names in generated text against the training cast;
- ``gates``, ``entropy``, ``hull``, ``attention``: statistics of captured attention (Figures 3-6);
- ``sink``: attention mass on the first token per layer and head (Qiu et al. 2025);
- ``retrieval``: the synthetic pattern-retrieval task;
- ``export_size``: a preset's export, format by format, in bytes (fresh weights);
- ``inputs``: what the attention analyses read (a run, validation windows) and ``write_csv``.

The analyses of a study folder's curves (``attnlab analyze curves``, ``reach``) live in
attnlab.studies (curves, reach): they read studies, which import these modules. No argparse
here: the ``attnlab analyze``, ``eval`` and ``retrieval`` commands live in attnlab/commands/.
"""
