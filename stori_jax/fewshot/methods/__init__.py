"""The few-shot methods (`registry`), with the built-in ones registered: SToRI (`stori.py`)
and TaskRes (`taskres.py`)."""

from stori_jax.fewshot.methods.registry import (
  DEFAULT,
  FewShotMethod,
  Method,
  get,
  names,
  of,
  register,
  registered,
  unregister,
)
from stori_jax.fewshot.methods import stori, taskres
