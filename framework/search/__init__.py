"""The Optuna study: samplers, pruners, constraints, resume, importances (`tuner`). The only
room that imports optuna; the rest of the project sees proposals and evaluations, never Optuna
objects."""

from framework.base.exports import lazy_exports

__getattr__, __all__ = lazy_exports(__name__, {
    "Tuner": "tuner",
    "Proposal": "tuner",
    "Evaluation": "tuner",
    "param_importances": "tuner",
})
