"""Reading CLIP checkpoints of every supported layout into this project's params."""

from stori_jax.checkpoints.errors import CheckpointError, CheckpointMismatchError
from stori_jax.checkpoints.validate import check_params
