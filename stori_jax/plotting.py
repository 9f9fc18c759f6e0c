"""matplotlib for the figure writers: the file-only Agg backend, imported on first use."""


def pyplot():
  """matplotlib.pyplot on the Agg backend (no display needed; figures go to PNG files)."""
  import matplotlib  # pylint: disable=import-outside-toplevel

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  return plt
