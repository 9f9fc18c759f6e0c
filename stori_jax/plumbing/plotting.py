"""matplotlib for the figure writers: the file-only Agg backend, imported on first use."""


def pyplot():
  """matplotlib.pyplot on the Agg backend (no display needed; figures go to PNG files)."""
  import matplotlib  # lazy: a slow import that only the figure writers need

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # lazy: after the backend is chosen

  return plt
