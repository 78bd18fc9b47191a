"""The Optuna study: samplers, pruners, constraints, resume, importances (`tuner`). The only
room that imports optuna; the rest of the project sees proposals and evaluations, never Optuna
objects."""
