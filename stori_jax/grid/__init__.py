"""The paper's few-shot tables as one command (SToRI Tables 1, 2 and 8; Fig. 10): datasets x
shots x seeds x methods (x the values of a swept config key), each cell a full few-shot run,
averaged over seeds as mean ± std.

cells: a grid config expanded into cells, each a full few-shot train config with the paper's
learning rate; runner: the cells run in their own workdirs (`fewshot.trainer.run`), finished
ones skipped, interrupted ones resumed; tables: the paper's layout in markdown and JSON; figure:
a sweep's accuracy against its values (mean line, std shading). The command line is
`python -m stori_jax.run_grid`.
"""
